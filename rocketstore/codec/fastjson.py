# SPDX-License-Identifier: Apache-2.0
"""fastjson's JSON dialect, as a 4.9.x broker writes its config/*.json files (doc/04 §4):
PrettyFormat's tab indentation, bean members in alphabetical order, integer-keyed maps as
`{0:3,1:0` on one line; the reader also takes Gson's whitespace and quoted integer keys."""
import json
import re

__all__ = ["bean", "parse_fastjson", "to_fastjson"]


# ---- fastjson pretty writer ---------------------------------------------------------------

def _scalar(value):
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _write(value, out, indent):
    """Append `value` to `out` as fastjson's PrettyFormat does. Dicts whose keys are all ints
    are MapSerializer's non-string-key case: no newline before members, one before `}`."""
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        out.append("{")
        inner = "\n" + "\t" * (indent + 1)
        int_keys = all(isinstance(k, int) and not isinstance(k, bool) for k in value)
        items = value.items()
        if int_keys:
            # A ConcurrentHashMap<Integer, _> iterates small keys in ascending order.
            items = sorted(items)
        first = True
        for key, item in items:
            if item is None:            # fastjson omits null members
                continue
            if not first:
                out.append(",")
            first = False
            if int_keys:
                out.append(str(key))
            else:
                out.append(inner)
                out.append(json.dumps(str(key), ensure_ascii=False))
            out.append(":")
            _write(item, out, indent + 1)
        out.append("\n" + "\t" * indent + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        out.append("[")
        inner = "\n" + "\t" * (indent + 1)
        for i, item in enumerate(value):
            if i:
                out.append(",")
            out.append(inner)
            _write(item, out, indent + 1)
        out.append("\n" + "\t" * indent + "]")
    else:
        out.append(_scalar(value))


def to_fastjson(value):
    """`JSON.toJSONString(value, PrettyFormat)`: no trailing newline, as string2File writes."""
    out = []
    _write(value, out, 0)
    return "".join(out)


def bean(**members):
    """A JavaBean as fastjson writes it: members sorted by name, nulls dropped."""
    return {k: members[k] for k in sorted(members) if members[k] is not None}


# ---- lenient reader -----------------------------------------------------------------------

# A string (skipped whole, so digits inside strings are never touched) or an unquoted
# integer object key after `{` or `,`.
# An unterminated string also matches, up to the end of the text: without that, each `"` of a
# hostile file like `"\"\"\"…` rescans to the end and the substitution goes quadratic (a 100 KB
# file took minutes); json.loads still rejects the unterminated string afterwards.
_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|([{,]\s*)(-?\d+)(\s*:)', re.S)


def _quote_key(m):
    if m.group(2) is None:
        return m.group(0)
    return f'{m.group(1)}"{m.group(2)}"{m.group(3)}'


def parse_fastjson(text):
    """Parse fastjson's dialect (unquoted integer keys) or strict JSON. Raises ValueError."""
    try:
        return json.loads(_BARE_KEY.sub(_quote_key, text))
    except RecursionError:
        # json's C decoder recurses per nesting level; a hostile file nested a million deep
        # must read as corrupt (-> .bak), not escape load() as a RecursionError.
        raise ValueError("JSON nested too deeply") from None
