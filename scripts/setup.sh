# Sourced by scripts/quickstart and scripts/test (`. scripts/setup.sh run|dev`, from the repo root): make the
# virtualenv on first use, install what the command needs, and activate it.
#
#   run   torch, then requirements.txt                        (what train.py needs)
#   dev   torch, then requirements.txt + requirements-dev.txt (the tests: pytest and the parity oracles too)
#
# torch comes first and on its own, as .ci/run always did, so that the requirement files never choose its build:
# $MINIGRPO_TORCH, default torch==2.13.0 (the CPU wheel where pip is set up for it; on a GPU machine set it to
# the build for your CUDA). The venv is $MINIGRPO_VENV, default .venv in the repo. What was installed is stamped
# in the venv with a hash of the torch spec and the requirement files: the same hash next time means nothing to
# install, and an edited requirement file means pip runs again over the same venv.
venv="${MINIGRPO_VENV:-.venv}"
torch_spec="${MINIGRPO_TORCH:-torch==2.13.0}"
case "$1" in
    run) files=(requirements.txt) ;;
    dev) files=(requirements.txt requirements-dev.txt) ;;
    *) echo "scripts/setup.sh: say run or dev" >&2; return 2 ;;
esac
hash_of() { { echo "$torch_spec"; cat "$@"; } | sha256sum | cut -d' ' -f1; }
want="$(hash_of "${files[@]}")"
stamp="$venv/.minigrpo-$1"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then      # none yet, or one cut short
        echo "setting up $venv (first use: a few minutes)" >&2
        python3 -m venv --clear "$venv" || { echo "scripts/setup.sh: python3 -m venv failed; on Debian/Ubuntu:" \
            "apt-get install python3-venv" >&2; return 1; }
        "$venv/bin/python" -m pip install -q --upgrade pip
    fi
    "$venv/bin/python" -m pip install -q "$torch_spec"
    reqs=()
    for f in "${files[@]}"; do reqs+=(-r "$f"); done
    "$venv/bin/python" -m pip install -q "${reqs[@]}"
    "$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|peft|tokenizers|safetensors) ' >&2 || true
    echo "$want" > "$stamp"
    hash_of requirements.txt > "$venv/.minigrpo-run"      # dev installs all that run needs too
fi
. "$venv/bin/activate"
