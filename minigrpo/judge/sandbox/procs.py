"""A sandbox's processes seen from outside (private to the sandbox package; standard library only): what the judge
reads of them in the host's /proc, where nothing the payload does inside its own namespaces can reach.

- tree_pids / tree_ticks: a process and its live descendants, and their CPU ticks (the clock where there is no
  cgroup).
- demand: whether the processes ran or waited for a CPU since the last look (the stall clock: a starved answer is
  not a sleeping one).
- open_files: the regular files their descriptors hold open (an answer's closing, observed, never reported).

The host's /proc names each process by its host pid, whatever pid namespace it lives in, so a payload that mounts
a /proc of its own, or fakes one, changes only what it sees itself.
"""

import os
import stat


def _clk_tck():
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


TICK = _clk_tck()
MAX_FDS = 4096      # descriptors listed per sandbox; more is reported as one entry of its own (a leak in itself)


def _proc_stat(pid):
    """(ppid, cpu ticks incl. reaped children) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:   # fields after the name: state ppid ... utime(14) stime cutime cstime -> indexes 11..14 here
        return int(rest[1]), sum(int(x) for x in rest[11:15])
    except (IndexError, ValueError):
        return None


def all_pids():
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _tree(root):
    """{pid: cpu ticks} of root and all its live descendants."""
    stats = {}
    for pid in all_pids():
        st = _proc_stat(pid)
        if st is not None:
            stats[pid] = st
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in out or pid not in stats:
            continue
        out[pid] = stats[pid][1]
        todo.extend(children.get(pid, []))
    return out


def tree_pids(root):
    return list(_tree(root))


def tree_ticks(root):
    """CPU ticks of root and all its live descendants (each one's own + its reaped children's)."""
    return sum(_tree(root).values())


def _tasks(pid):
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def demand(pids):
    """(nanoseconds the processes' threads have waited in a run queue, whether one is runnable or in the kernel's
    uninterruptible wait now). The wait is the kernel's schedstat (None where the kernel keeps none); the state (R,
    D) is read from each thread's stat. D is a wait the kernel imposes (disk, a lock a fork bomb beside it holds
    busy), not one the process chose, as a sleep or a blocking read is."""
    waited, active, have = 0, False, False
    for pid in pids:
        for tid in _tasks(pid):
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(base + "/schedstat", "rb") as f:
                    waited += int(f.read().split()[1])
                have = True
            except (OSError, IndexError, ValueError):
                pass
            try:
                with open(base + "/stat", "rb") as f:
                    data = f.read()
                active = active or data[data.rfind(b")") + 2:][:1] in (b"R", b"D")
            except OSError:
                pass
    return (waited if have else None), active


def open_files(pids):
    """Sorted ids ("device:inode") of the regular files the processes hold descriptors on, as the kernel's fd tables
    say (stat through /proc/PID/fd follows each descriptor to its file, whatever name or link the payload used).
    Past MAX_FDS descriptors the list ends with "more than N descriptors"."""
    held, seen = set(), 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            seen += 1
            if seen > MAX_FDS:
                return sorted(held) + [f"more than {MAX_FDS} descriptors"]
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                held.add(f"{st.st_dev}:{st.st_ino}")
    return sorted(held)
