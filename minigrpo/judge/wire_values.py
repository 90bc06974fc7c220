"""Values of library types on the channel of wire.py: the datetime family, Decimal, Fraction, UUID, paths,
numpy arrays and scalars, pandas frames and series -- by value, as the few library types tests compare. Standard
library only (numpy and pandas are looked up or imported only when such a value crosses). In the sandboxed
child's program this file's source comes first, then wire.py's and wire_rpc.py's (see minigrpo/judge/driver_host.py).

Decoding is bounded: a Fraction only in the form str(Fraction) writes (a forged "1e30000000" would make
10**30000000 in the driver), a Decimal of at most 200 characters, a DataFrame of at most MAX_COLUMNS columns and
MAX_CELLS cells, an object array never from raw bytes.
"""

import base64
import re
import sys

MAX_COLUMNS, MAX_CELLS = 1000, 1_000_000    # the largest DataFrame decoded
_FRACTION = re.compile(r"-?[0-9]+(/[0-9]+)?")


class ProtocolError(Exception):
    """The peer sent something that is not a well-formed message, or a value we refuse to encode."""


class TooLarge(ProtocolError):
    """A value or message over the channel's cap (wire.MAX_MESSAGE bytes, wire.MAX_ITEMS parts counted by value)."""


def stdlib_value(v, t, codec, depth):
    """The encoding of a datetime-family, Decimal, Fraction, UUID or path value, else None. Their modules are
    looked up, never imported: a value of one of these types exists only once its module is, and the sandboxed
    child starts faster without them."""
    m = sys.modules
    if (dt := m.get("datetime")) is not None:
        if t is dt.datetime:
            return ["dt", v.isoformat()]
        if t is dt.date:
            return ["date", v.isoformat()]
        if t is dt.time:
            return ["time", v.isoformat()]
        if t is dt.timedelta:
            return ["td", v.days, v.seconds, v.microseconds]
        if t is dt.timezone:
            return ["tz", codec.encode(v.utcoffset(None), depth + 1)]
    if (dec := m.get("decimal")) is not None and t is dec.Decimal:
        return ["dec", str(v)]
    if (fr := m.get("fractions")) is not None and t is fr.Fraction:
        return ["frac", str(v)]
    if (uu := m.get("uuid")) is not None and t is uu.UUID:
        return ["uuid", str(v)]
    if (pl := m.get("pathlib")) is not None and t in (pl.PurePosixPath, pl.PureWindowsPath, pl.PosixPath,
                                                         pl.WindowsPath):
        return ["path", t.__name__, str(v)]
    return None


def library_types():
    """{type: tag} of optional library types present in this interpreter (numpy, pandas), looked up lazily."""
    found = {}
    np = sys.modules.get("numpy")
    if np is not None:
        found[np.ndarray] = "nd"
    pd = sys.modules.get("pandas")
    if pd is not None:
        found[pd.DataFrame] = "df"
        found[pd.Series] = "ser"
    return found


def encode_library(codec, tag, v, depth):
    if tag == "nd":
        if v.dtype.hasobject:
            return ["ndo", list(v.shape), [codec.encode(x, depth + 1) for x in v.ravel().tolist()]]
        return ["nd", v.dtype.str, list(v.shape), base64.b64encode(v.tobytes()).decode()]
    if tag == "ser":
        return ["ser", codec.encode(v.to_frame(), depth + 1), codec.encode(v.name, depth + 1)]
    columns = [codec.encode(c, depth + 1) for c in v.columns]
    index = [codec.encode(i, depth + 1) for i in v.index.tolist()]
    data = [[codec.encode(x, depth + 1) for x in v[c].tolist()] for c in v.columns]
    dtypes = [str(d) for d in v.dtypes]
    return ["df", columns, index, codec.encode(v.index.name, depth + 1), data, dtypes,
            codec.encode(v.columns.name, depth + 1)]


def decode_stdlib(codec, e, depth):
    tag = e[0]
    if tag in ("dt", "date", "time", "td", "tz"):
        import datetime
        if tag == "td":
            return datetime.timedelta(days=e[1], seconds=e[2], microseconds=e[3])
        if tag == "tz":
            return datetime.timezone(codec.decode(e[1], depth + 1))
        return {"dt": datetime.datetime, "date": datetime.date, "time": datetime.time}[tag].fromisoformat(e[1])
    if tag == "dec":
        import decimal
        if not isinstance(e[1], str) or len(e[1]) > 200:
            raise ProtocolError("malformed Decimal")
        return decimal.Decimal(e[1])
    if tag == "frac":       # only what str(Fraction) writes: "1e30000000" would make 10**30000000 here
        import fractions
        if not isinstance(e[1], str) or len(e[1]) > 2000 or not _FRACTION.fullmatch(e[1]):
            raise ProtocolError("malformed Fraction")
        return fractions.Fraction(e[1])
    if tag == "uuid":
        import uuid
        return uuid.UUID(e[1])
    import pathlib
    cls = {"PurePosixPath": pathlib.PurePosixPath, "PureWindowsPath": pathlib.PureWindowsPath}
    return cls.get(e[1], pathlib.PurePosixPath)(e[2])


def decode_library(codec, e, depth):
    import numpy as np
    tag = e[0]
    if tag == "nd":
        return np.frombuffer(base64.b64decode(e[3]), dtype=np.dtype(e[1])).reshape(e[2]).copy()
    if tag == "ndo":
        flat = [codec.decode(x, depth + 1) for x in e[2]]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(e[1])
    if tag == "np":
        return np.frombuffer(base64.b64decode(e[2]), dtype=np.dtype(e[1]))[0]
    import pandas as pd
    if tag == "ser":
        frame = codec.decode(e[1], depth + 1)
        series = frame.iloc[:, 0]
        series.name = codec.decode(e[2], depth + 1)
        return series
    if len(e[1]) > MAX_COLUMNS or len(e[1]) * len(e[2]) > MAX_CELLS:
        raise ProtocolError("DataFrame too large")      # decoding costs the driver per column and per cell
    columns = [codec.decode(c, depth + 1) for c in e[1]]
    index = pd.Index([codec.decode(i, depth + 1) for i in e[2]], name=codec.decode(e[3], depth + 1))
    frame = pd.DataFrame({i: [codec.decode(x, depth + 1) for x in col] for i, col in enumerate(e[4])},
                         index=index)
    frame.columns = pd.Index(columns, name=codec.decode(e[6], depth + 1))
    for column, dtype in zip(frame.columns, e[5]):
        try:
            frame[column] = frame[column].astype(dtype)
        except (TypeError, ValueError):
            pass
    return frame
