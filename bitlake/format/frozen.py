"""Containers a snapshot holds: a dict and a list that read (and compare, and pickle) as theirs and refuse every
change, so a snapshot (:class:`bitlake.format.state.TableState`) and the models in it are values."""

from __future__ import annotations


class FrozenDict(dict):
    """A dict a snapshot holds: reads as a dict, refuses every change (a snapshot is a value)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("a table snapshot is immutable: apply a commit to get a new one")

    __setitem__ = __delitem__ = __ior__ = pop = popitem = clear = update = setdefault = _refuse  # type: ignore

    def __reduce__(self):
        return type(self), (dict(self),)


class FrozenList(list):
    """A list a snapshot holds: reads (and compares) as a list, refuses every change."""

    _refuse = FrozenDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = sort = \
        reverse = _refuse  # type: ignore

    def __reduce__(self):
        return type(self), (list(self),)
