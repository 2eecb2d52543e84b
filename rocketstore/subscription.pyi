# SPDX-License-Identifier: Apache-2.0
# Types of rocketstore.subscription (checked against the module by mypy.stubtest).
from collections.abc import Callable, Mapping
from typing import Optional, Union

import numpy as np
import numpy.typing as npt

SUB_ALL: str

_PropertyFilter = Optional[Callable[[Mapping[str, str]], bool]]

class Subscription:
    expression: str
    tags: frozenset[str]
    codes: npt.NDArray[np.int64]
    tag_bytes: bytes
    tag_ends: npt.NDArray[np.int64]
    def __init__(self, expression: str, tags: frozenset[str]) -> None: ...
    @property
    def sub_all(self) -> bool: ...
    def matches_tags_code(self, tags_code: int) -> bool: ...
    def matches_tags(self, tags: Optional[str]) -> bool: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

def parse_subscription(expression: Union[str, Subscription, None]) -> Subscription: ...
def read_filters(subscription: Union[str, Subscription, None], property_filter: _PropertyFilter
                 ) -> tuple[Optional[Subscription], _PropertyFilter]: ...
