"""idem's request fingerprint (docs/SQL-API.md: the fingerprint), in Python.

The digest idem's HTTP layer and gateway compute, so keys shared with them agree. It is
checked against docs/fingerprint-vectors.json by the self-check.
"""

import hashlib
import json
import struct

UNRESERVED = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
RESERVED = set(b":/?#[]@!$&'()*+,;=")
HEX = "0123456789ABCDEF"
MAX_DEPTH = 128


class DuplicateMember(ValueError):
    """An object names a member twice: the request is refused."""


def _normalise_escapes(s: str) -> str:
    data = s.encode("utf-8")
    out = []
    i = 0
    while i < len(data):
        b = data[i]
        if b == 0x25:  # '%'
            pair = data[i + 1 : i + 3]
            if len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair):
                decoded = int(pair, 16)
                out.append(chr(decoded) if decoded in UNRESERVED else "%" + HEX[decoded >> 4] + HEX[decoded & 15])
                i += 3
                continue
            out.append("%25")
        elif b in UNRESERVED or b in RESERVED:
            out.append(chr(b))
        else:
            out.append("%" + HEX[b >> 4] + HEX[b & 15])
        i += 1
    return "".join(out)


def canonical_path(path: str) -> str:
    return "/" if path == "" else _normalise_escapes(path)


def canonical_query(query):
    pairs = [_normalise_escapes(p) for p in (query or "").split("&") if p]
    pairs.sort(key=lambda p: p.split("=", 1)[0])  # stable: repeated names keep their order
    return "&".join(pairs)


def _is_json_media_type(ct: str) -> bool:
    essence = ct.split(";", 1)[0].strip().lower()
    return essence == "application/json" or essence.endswith("+json")


class _Num(str):
    """A number's exact text."""


def _pairs(pairs):
    seen = set()
    for name, _ in pairs:
        if name in seen:
            raise DuplicateMember(name)
        seen.add(name)
    return dict(pairs)


def _bad_constant(_):
    raise ValueError("not RFC 8259")


def _write_string(s: str, out: list):
    out.append('"')
    for c in s:
        o = ord(c)
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c in "\b\f\n\r\t":
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif o < 0x20:
            out.append("\\u%04x" % o)
        else:
            out.append(c)
    out.append('"')


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def _write(v, out: list, omit, at_root_path):
    if isinstance(v, dict):
        out.append("{")
        first = True
        for name in sorted(v, key=lambda n: n.encode("utf-16-be")):
            path = at_root_path + [name] if at_root_path is not None else None
            if path is not None and path in omit:
                continue
            if not first:
                out.append(",")
            first = False
            _write_string(name, out)
            out.append(":")
            _write(v[name], out, omit, path)
        out.append("}")
    elif isinstance(v, list):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _write(x, out, omit, None)  # omitted paths name object members only
        out.append("]")
    elif isinstance(v, _Num):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        _write_string(v, out)
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    else:
        out.append("null")


def canonical_json(content_type, body: bytes, omit_fields=()):
    """The canonical text, or None when the body is hashed as bytes."""
    if (content_type is not None and not _is_json_media_type(content_type)) or not body:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    dup = None
    try:
        value = json.loads(text, parse_int=_Num, parse_float=_Num, parse_constant=_bad_constant,
                           object_pairs_hook=_pairs)
    except DuplicateMember as e:
        dup = e
    except (ValueError, RecursionError):
        return None
    if dup is not None:
        # Only JSON text can be refused: re-read without the check to tell.
        try:
            json.loads(text, parse_constant=_bad_constant)
        except (ValueError, RecursionError):
            return None
        raise dup
    if _depth(value) > MAX_DEPTH:
        return None
    out = []
    _write(value, out, [p.split(".") for p in omit_fields], [])
    return "".join(out)


def fingerprint(method, path, query, principal, content_type, body: bytes,
                headers=(), fingerprint_headers=(), omit_fields=()) -> bytes:
    """The 32-byte digest; raises DuplicateMember for a refused body."""
    h = hashlib.sha256()

    def field(tag: bytes, data: bytes):
        h.update(tag)
        h.update(struct.pack(">Q", len(data)))
        h.update(data)

    chosen_names = [n.lower() for n in fingerprint_headers]
    canonical = canonical_json(content_type, body, omit_fields)
    field(b"v2", b"idem-fingerprint")
    field(b"m", method.upper().encode())
    field(b"u", canonical_path(path).encode())
    field(b"q", canonical_query(query).encode())
    field(b"p", principal.encode())
    chosen = sorted((n.lower(), v) for n, v in headers if n.lower() in chosen_names)
    for n, v in chosen:
        field(b"hn", n.encode())
        field(b"hv", v.strip().encode())
    if canonical is not None:
        field(b"bj", canonical.encode("utf-8"))
    else:
        field(b"bb", body)
    return h.digest()
