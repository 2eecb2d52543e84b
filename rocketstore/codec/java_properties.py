# SPDX-License-Identifier: Apache-2.0
"""The java.util.Properties text format (broker.conf): Properties.load's reading and
Properties.store's escaping, for StoreConfig.from_properties and to_properties."""
import re

from ..errors import ConfigError

__all__ = ["decode_properties_bytes", "format_property", "parse_properties"]

_WS = " \t\f"
_UNESCAPE = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text):
    """Parse java.util.Properties text into an ordered dict; later keys win, as in Java.

    Handles `key=value`, `key: value` and `key value`, `#`/`!` comment lines, backslash line
    continuations (leading whitespace of the next line dropped) and the escapes \\t \\n \\r
    \\f \\uXXXX; a backslash before any other character stands for that character.
    """
    props = {}
    for line in _logical_lines(text):
        key, value = _split_key_value(line)
        props[key] = value
    return props


def _logical_lines(text):
    natural = re.split(r"\r\n|\r|\n", text)
    i, n = 0, len(natural)
    while i < n:
        line = natural[i].lstrip(_WS)
        i += 1
        # Only the first natural line can make a comment: a continued line starting with '#'
        # is part of the value.
        if not line or line[0] in "#!":
            continue
        while _odd_trailing_backslashes(line):
            line = line[:-1]
            if i >= n:          # Java drops a continuation backslash at end of input
                break
            line += natural[i].lstrip(_WS)
            i += 1
        yield line


def _odd_trailing_backslashes(line):
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def _split_key_value(line):
    # Properties.load0: the key ends at the first unescaped '=', ':' or whitespace; then
    # whitespace and at most one '=' or ':' are skipped before the value.
    n = len(line)
    key_end, value_start, has_sep, escaped = n, n, False, False
    for k, c in enumerate(line):
        if not escaped and c in "=:":
            key_end, value_start, has_sep = k, k + 1, True
            break
        if not escaped and c in _WS:
            key_end, value_start = k, k + 1
            break
        escaped = c == "\\" and not escaped
    while value_start < n:
        c = line[value_start]
        if c not in _WS:
            if has_sep or c not in "=:":
                break
            has_sep = True
        value_start += 1
    return _unescape(line[:key_end]), _unescape(line[value_start:])


def _unescape(s):
    if "\\" not in s:
        return s
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        if i >= n:
            break
        c = s[i]
        i += 1
        if c == "u":
            digits = s[i:i + 4]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(f"malformed \\uxxxx escape in {s!r}")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_UNESCAPE.get(c, c))
    result = "".join(out)
    # Java strings are UTF-16: \ud83d\ude00 is one character. Join such surrogate pairs.
    if any("\ud800" <= ch <= "\udfff" for ch in result):
        result = result.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return result


def _escape(s, is_key):
    # Properties.saveConvert: spaces are escaped in keys and at the start of a value; the
    # separators and comment characters always; anything outside printable ASCII as \uXXXX.
    out = []
    for i, c in enumerate(s):
        if c == " ":
            out.append("\\ " if is_key or i == 0 else " ")
        elif c in "\t\n\r\f":
            out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[c])
        elif c in "=:#!\\":
            out.append("\\" + c)
        elif " " < c <= "~":
            out.append(c)
        else:
            units = c.encode("utf-16-be", "surrogatepass")
            out.extend(f"\\u{units[j]:02X}{units[j + 1]:02X}" for j in range(0, len(units), 2))
    return "".join(out)


def format_property(key, value):
    """One `key=value` line as Properties.store writes it (escapes, \\uXXXX)."""
    return f"{_escape(key, True)}={_escape(value, False)}"


def decode_properties_bytes(data):
    """The text of a properties file. Java's Properties.load(InputStream) decodes ISO-8859-1;
    a UTF-8 broker.conf (non-ASCII paths) is what people actually write, so prefer it and
    fall back to Java's reading."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")
