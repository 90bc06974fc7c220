"""argparse as the scripts use it, without torch (judge.py imports it): --help shows every default, and a flag
argparse refuses is one line."""
import argparse
import copy


class DefaultsShown(argparse.HelpFormatter):
    """--help names each option's default: argparse's value, unless the help words it (a computed default, or
    what leaving the option out means)."""

    def _format_action(self, action):
        shown = all(action.default is not v for v in (None, False, argparse.SUPPRESS)) and action.option_strings \
            and "default" not in (action.help or "")       # a help that words its default itself
        if shown:           # a flag without a help text still gets its default's line
            action = copy.copy(action)
            action.help = f"{action.help or ''} (default: %(default)s)".strip()
        return super()._format_action(action)


class OneLineParser(argparse.ArgumentParser):
    """A flag argparse refuses is one line, not the whole usage, with the nearest choice when it is a typo; the
    SystemExit's text is printed by cli.parse as "train.py: error: <line>", exit code 2."""

    def error(self, message):
        raise SystemExit(message + did_you_mean(message))


def did_you_mean(message: str) -> str:
    """"; did you mean 'synthetic'?" for argparse's "invalid choice: 'synthtic' (choose from ...)"."""
    import difflib
    import re
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if not m:
        return ""
    close = difflib.get_close_matches(m[1], re.findall(r"'([^']*)'", m[2]) or m[2].split(", "), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
