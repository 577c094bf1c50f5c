"""The semantics contract applied to a commit's records at once, without a Python loop: which records are accepted,
which visible rows they end, and each key's last accepted record (docs/FORMAT.md, "Writing"). The inline MetaGen,
the Spark MetaGen's tasks and restatements fold with it."""

from __future__ import annotations

import dataclasses

import numpy as np

from bitlake.format.order import lexsort


@dataclasses.dataclass
class Fold:
    """The contract applied to a commit's records, in contract order (``order`` maps to input rows).

    Per record: its delta, row id, delete flag and batch; ``accepted``; ``until`` (it supersedes a
    visible row, whose row id is ``last_rid``). ``final``: the input rows that are their key's last
    accepted record, which become the key-store entries.
    """

    order: np.ndarray
    delta: np.ndarray
    rid: np.ndarray
    deleted: np.ndarray
    batch: np.ndarray
    accepted: np.ndarray
    until: np.ndarray
    last_rid: np.ndarray
    final: np.ndarray


def fold(codes, deltas, rids, deleted, batch, found, prior_d, prior_rid, prior_deleted) -> Fold:
    """Applies the semantics contract to records of keys ``codes`` (0..k-1, each present), given each
    key's stored entry (``found[code]``, its delta, row id and delete flag), without a Python loop.

    Records are put in contract order, (key, batch, delta, row id), and each key's stored entry is
    placed before its records as a slot. A record is accepted iff its delta is at least the maximum
    delta before it in its key (accepted deltas never decrease, so that is the last accepted one's);
    group-wise running maxima come from one cumulative maximum over ``key * M + delta rank``, which
    no earlier key can reach. The previous accepted record (or the slot) is a forward fill of
    positions; it is a visible row iff it is an upsert (a missing entry counts as not visible).
    """
    if len(codes) == len(found):
        return _fold_one_record_a_key(codes, deltas, rids, deleted, batch, found, prior_d, prior_rid, prior_deleted)
    order = lexsort((rids, deltas, batch, codes))
    c, d, r, dl, b = codes[order], deltas[order], rids[order], deleted[order], batch[order]
    n, k = len(c), len(found)
    pos = np.arange(n) + c + 1  # record i's place, after the slots of keys 0..c
    slot = np.searchsorted(c, np.arange(k)) + np.arange(k)  # key g's slot, before its first record
    size = n + k
    is_slot = np.zeros(size, dtype=bool)
    is_slot[slot] = True
    all_d = np.empty(size, dtype=np.int64)
    all_d[pos], all_d[slot] = d, prior_d
    ranks = np.unique(all_d, return_inverse=True)[1].reshape(-1) + 1
    ranks[slot[~found]] = 0  # no stored entry: nothing to be older than
    m = int(ranks.max()) + 1
    key_of = np.empty(size, dtype=np.int64)
    key_of[pos], key_of[slot] = c, np.arange(k)
    running = np.maximum.accumulate(key_of * m + ranks)
    accepted = ranks[pos] + c * m >= running[pos - 1]
    marks = np.where(is_slot, np.arange(size), -1)
    marks[pos[accepted]] = pos[accepted]
    last = np.maximum.accumulate(marks)
    all_rid = np.empty(size, dtype=np.int64)
    all_rid[pos], all_rid[slot] = r, prior_rid
    invisible = np.empty(size, dtype=bool)
    invisible[pos], invisible[slot] = dl, prior_deleted | ~found
    before = last[pos - 1]
    until = accepted & ~invisible[before]
    ends = np.append(slot[1:] - 1, size - 1)  # each key's last place
    final_place = last[ends]
    final_place = final_place[~is_slot[final_place]]
    record_of_place = final_place - key_of[final_place] - 1
    return Fold(order, d, r, dl, b, accepted, until, all_rid[before], order[record_of_place])


def _fold_one_record_a_key(codes, deltas, rids, deleted, batch, found, prior_d, prior_rid, prior_deleted) -> Fold:
    """:func:`fold` when every key has one record (a load, most batches): no ordering among records is
    needed, each is compared with its key's stored entry alone."""
    order = np.arange(len(codes))
    if not found.any():  # a load: every record is accepted and supersedes nothing
        return Fold(order, deltas, rids, deleted, batch, np.ones(len(codes), bool), np.zeros(len(codes), bool),
                    np.zeros(len(codes), np.int64), order)
    stored = prior_d[codes]
    accepted = ~found[codes] | (deltas >= stored)
    visible_before = found[codes] & ~prior_deleted[codes]
    return Fold(order, deltas, rids, deleted, batch, accepted, accepted & visible_before, prior_rid[codes],
                order[accepted])
