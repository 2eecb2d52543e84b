# SPDX-License-Identifier: Apache-2.0
"""Tag subscriptions: the expression a consumer subscribes with ("TagA || TagB"), parsed as
RocketMQ 4.9's FilterAPI.buildSubscriptionData parses it, and what a read filters by.

A read with a subscription filters in two stages, as a 4.9 broker and its client do together
(doc/01 §6):
1. each ConsumeQueue unit's tagsCode against the hashes of the subscribed tags
   (ExpressionMessageFilter#isMatchedByConsumeQueue: the low 32 bits of the unit's long, as
   Java's `tagsCode.intValue()`, in the set of `String.hashCode()`s), before the record is read;
2. the record's TAGS string against the subscribed tags, since two tags may share a hash
   ("Aa" and "BB"). A 4.9 client does this after the pull (PullAPIWrapper#processPullResult);
   here it runs in the store's walk, so a unit it drops is a filtered unit like the first
   stage's: it does not count toward max_msg_nums, and next_begin_offset moves past it.
A property predicate (MessageStore.get_message's `property_filter`) may follow, in the place
of the broker's ExpressionMessageFilter#isMatchedByCommitLog; SQL92 expressions are not
parsed here.

Parsed subscriptions are cached by expression, as a broker keeps one SubscriptionData per
consumer group and topic instead of parsing each pull's."""
import functools

import numpy as np

from .errors import InvalidArgumentError
from .message import java_string_hash

SUB_ALL = "*"
# String.trim(): every char up to U+0020 goes, and nothing else (Python's strip() would also
# take U+0085, U+00A0, ... and leave U+0000..U+0008).
_JAVA_TRIM = "".join(map(chr, range(0x21)))


class Subscription:
    """A parsed tag expression. `tags`: the subscribed tags (empty for "*": everything);
    `codes`: their String.hashCode()s as a sorted int64 array (what the compiled walk
    searches); `tag_bytes` and `tag_ends`: the tags in UTF-8, concatenated, and where each
    ends (the tags_match kernel's arguments)."""

    __slots__ = ("expression", "tags", "codes", "tag_bytes", "tag_ends", "_code_set")

    def __init__(self, expression, tags):
        self.expression = expression
        self.tags = tags
        ordered = sorted(tags)
        codes = sorted({java_string_hash(t) for t in ordered})
        self._code_set = frozenset(codes)
        self.codes = np.array(codes, dtype=np.int64)
        self.codes.flags.writeable = False
        encoded = [t.encode("utf-8", "surrogatepass") for t in ordered]
        self.tag_bytes = b"".join(encoded)
        self.tag_ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
        self.tag_ends.flags.writeable = False

    @property
    def sub_all(self):
        """Whether every message matches ("*", empty or None)."""
        return not self.tags

    def matches_tags_code(self, tags_code):
        """The first stage: whether a unit's tagsCode may be a subscribed tag's (its low 32
        bits, sign-extended, among the hashes)."""
        if not self.tags:
            return True
        low = tags_code & 0xFFFFFFFF
        return (low - (1 << 32) if low & 0x80000000 else low) in self._code_set

    def matches_tags(self, tags):
        """The second stage: whether a message with this TAGS value (None: none) is taken."""
        return not self.tags or (tags is not None and tags in self.tags)

    def __eq__(self, other):
        return isinstance(other, Subscription) and other.tags == self.tags

    def __hash__(self):
        return hash(self.tags)

    def __repr__(self):
        return f"Subscription({self.expression!r}, tags={sorted(self.tags)!r})"


@functools.lru_cache(maxsize=4096)
def _parse(expression):
    if expression == "" or expression == SUB_ALL:
        return Subscription(SUB_ALL, frozenset())
    tags = set()
    for piece in expression.split("||"):
        tag = piece.strip(_JAVA_TRIM)
        if tag:
            tags.add(tag)
    if not tags:
        # buildSubscriptionData throws for "||" alone; " || " would subscribe to no tag and
        # match nothing: both are mistakes, refused here.
        raise InvalidArgumentError(f"subscription {expression!r} names no tag: give '*' for every "
                         "message, or tags separated by '||'")
    return Subscription(expression, frozenset(tags))


def parse_subscription(expression):
    """A Subscription from a tag expression: None, "" or "*" (exactly: " * " is the tag "*",
    as in RocketMQ) for every message, else tags separated by "||", each trimmed as Java's
    String.trim() trims, empty pieces skipped. A Subscription is returned as it is. Cached:
    an expression is parsed once."""
    if expression is None:
        return _parse(SUB_ALL)
    if isinstance(expression, Subscription):
        return expression
    if not isinstance(expression, str):
        raise TypeError(f"subscription must be a str (a tag expression such as 'TagA || TagB') "
                        f"or a Subscription, not {type(expression).__name__}")
    return _parse(expression)


def read_filters(subscription, property_filter):
    """A read's `subscription` and `property_filter` arguments checked: (the Subscription,
    or None when it takes every message, and the predicate). Raises TypeError or
    InvalidArgumentError naming the argument."""
    sub = parse_subscription(subscription)
    if property_filter is not None and not callable(property_filter):
        raise TypeError("property_filter must be callable (it is given each message's "
                        f"properties dict), not {type(property_filter).__name__}")
    return (sub if sub.tags else None), property_filter
