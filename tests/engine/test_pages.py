"""The block manager's rules one at a time: pages grow a page at a time from 1..N (never the
NULL page 0), allocation is all or nothing, a prefix hit is capped to leave one token to
compute, cached pages are shared by reference and evicted least recently used (a request's
tail first), hashes survive `free`, and `check()` catches a broken invariant."""

from __future__ import annotations

import random

import pytest

from jaxarena.engine.pages import NULL_PAGE, BlockManager, page_hash

PS = 4


def _bm(num_pages=8, prefix_caching=True) -> BlockManager:
    return BlockManager(num_pages, PS, prefix_caching)


def _run(bm: BlockManager, rid: str, tokens: list[int], extra_key=None) -> list[int]:
    """A request through its whole life up to finishing: match, allocate, compute, commit."""
    hit = bm.match_prefix(tokens, extra_key)
    assert bm.allocate(rid, len(tokens), prefix_pages=hit)
    bm.commit(rid, tokens, len(tokens), extra_key)
    bm.check()
    return bm.pages(rid)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="num_pages"):
        BlockManager(bad, PS, True)
    with pytest.raises(ValueError, match="page_size"):
        BlockManager(4, bad, True)


def test_grows_a_page_at_a_time_never_page_zero():
    bm = _bm(num_pages=3)
    for num_tokens, want in [(0, 0), (1, 1), (PS, 1), (PS + 1, 2), (2 * PS, 2), (3 * PS, 3)]:
        assert bm.allocate("a", num_tokens)
        assert len(bm.pages("a")) == want
        bm.check()
    assert sorted(bm.pages("a")) == [1, 2, 3] and NULL_PAGE not in bm.pages("a")
    assert bm.allocate("a", 2 * PS)  # shrinking is a no-op, not a release
    assert len(bm.pages("a")) == 3 and bm.num_free == 0 and bm.num_in_use == 3


def test_allocate_is_all_or_nothing():
    bm = _bm(num_pages=4)
    assert bm.allocate("a", 3 * PS)
    before = (bm.num_free, bm.num_in_use, bm.pages("a"))
    assert not bm.allocate("b", 2 * PS)  # needs 2, 1 free
    assert not bm.allocate("a", 5 * PS)  # needs 2 more, 1 free
    assert (bm.num_free, bm.num_in_use, bm.pages("a")) == before and bm.pages("b") == []
    bm.check()
    assert bm.allocate("b", PS)  # exactly the last page
    assert bm.num_free == 0


def test_match_is_capped_to_leave_one_token():
    bm = _bm()
    toks = list(range(100, 100 + 2 * PS))
    pages = _run(bm, "a", toks)
    bm.free("a")
    assert bm.match_prefix(toks) == pages[:1]  # a full hit recomputes the last page's token
    assert bm.match_prefix(toks + [7]) == pages  # one token past: both pages
    assert bm.match_prefix(toks[: PS + 1]) == pages[:1]
    assert bm.match_prefix(toks[:PS]) == []
    assert bm.match_prefix([]) == []


def test_match_needs_the_same_whole_prefix_and_extra_key():
    bm = _bm()
    a = list(range(2 * PS)) + [0]
    pages = _run(bm, "a", a, extra_key="lora1")
    assert bm.match_prefix(a, "lora1") == pages[:2]
    assert bm.match_prefix(a) == [] and bm.match_prefix(a, "lora2") == []
    # Same second page behind another first page: no hit on the second page either.
    b = [9] + a[1:]
    assert bm.match_prefix(b, "lora1") == []
    # The hash is a pure function of (parent, tokens, key).
    h0 = page_hash(None, a[:PS], "lora1")
    assert page_hash(h0, a[PS : 2 * PS], "lora1") == page_hash(h0, a[PS : 2 * PS], "lora1")
    assert page_hash(None, [1, 2], None) != page_hash(None, [1, 2], "")


def test_commit_registers_only_full_computed_pages():
    bm = _bm()
    toks = list(range(3 * PS))
    assert bm.allocate("a", len(toks))
    bm.commit("a", toks, 2 * PS - 1)  # one page full and computed, the second not yet
    bm.check()
    assert bm.match_prefix(toks) == bm.pages("a")[:1]
    bm.commit("a", toks, 2 * PS)
    assert bm.match_prefix(toks) == bm.pages("a")[:2]
    bm.commit("a", toks, 2 * PS)  # again: no change, no double registration
    bm.check()


def test_prefix_pages_are_shared_by_reference():
    bm = _bm(num_pages=6)
    toks = list(range(2 * PS)) + [1]
    pa = _run(bm, "a", toks)
    hit = bm.match_prefix(toks + [5, 6])
    assert hit == pa[:2]
    assert bm.allocate("b", len(toks) + 2, prefix_pages=hit)
    pb = bm.pages("b")
    assert pb[:2] == pa[:2] and pb[2] != pa[2]
    assert bm.num_in_use == 4  # 3 of a + 1 of b's own; the shared two count once
    bm.check()
    bm.free("a")
    assert bm.num_in_use == 3 and bm.num_cached == 0  # b still holds the shared pages
    bm.check()
    bm.free("b")
    assert bm.num_in_use == 0 and bm.num_cached == 2
    bm.check()


def test_hashes_survive_free_and_a_hit_revives_cached_pages():
    bm = _bm(num_pages=4)
    toks = list(range(3 * PS))
    pages = _run(bm, "a", toks)
    bm.free("a")
    assert bm.num_cached == 3 and bm.num_free == 4 and bm.num_in_use == 0
    hit = bm.match_prefix(toks)  # the resumed request: two pages (the last is recomputed)
    assert hit == pages[:2]
    # Four pages are free counting the cached ones, but two of them are the hit itself:
    # 3 pages for the request = the 2 hit + 1 new, and 4 would need 2 new of the 2 left.
    assert not bm.allocate("a", 5 * PS, prefix_pages=hit)
    bm.check()
    assert bm.allocate("a", 4 * PS, prefix_pages=hit)
    assert bm.pages("a")[:2] == pages[:2] and bm.num_free == 0
    bm.check()


def test_prefix_pages_reject_misuse():
    bm = _bm()
    toks = list(range(2 * PS)) + [1]
    _run(bm, "a", toks)
    hit = bm.match_prefix(toks)
    with pytest.raises(ValueError, match="first allocation"):
        bm.allocate("a", 20, prefix_pages=hit)
    with pytest.raises(ValueError, match="not a cached page"):
        bm.allocate("b", 20, prefix_pages=[bm.pages("a")[2]])
    with pytest.raises(ValueError, match="repeat"):
        bm.allocate("b", 20, prefix_pages=[hit[0], hit[0]])
    assert bm.pages("b") == []
    bm.check()


def test_eviction_is_least_recently_freed_first_tail_first():
    bm = _bm(num_pages=6)
    old = list(range(100, 100 + 3 * PS))
    new = list(range(200, 200 + 3 * PS))
    po = _run(bm, "old", old)
    pn = _run(bm, "new", new)
    bm.free("old")
    bm.free("new")
    assert bm.num_cached == 6
    # One page: the old request's LAST page goes first, so its first two still hit.
    assert bm.allocate("x", 1) and bm.pages("x") == [po[2]]
    assert bm.match_prefix(old + [0]) == po[:2]
    # Two more: the old request's middle, then its head; the newer one is untouched.
    assert bm.allocate("x", 3 * PS) and bm.pages("x") == [po[2], po[1], po[0]]
    assert bm.match_prefix(old + [0]) == [] and bm.match_prefix(new + [0]) == pn
    bm.check()


def test_a_hit_makes_pages_recently_used_again():
    bm = _bm(num_pages=4)
    a, b = list(range(2 * PS)), list(range(50, 50 + 2 * PS))
    pa, pb = _run(bm, "a", a), _run(bm, "b", b)
    bm.free("a")
    bm.free("b")
    hit = bm.match_prefix(a + [0])
    assert bm.allocate("a2", 2 * PS, prefix_pages=hit)  # a's pages revived, then freed again
    bm.free("a2")
    assert bm.allocate("x", 2 * PS) and sorted(bm.pages("x")) == sorted(pb)  # b is older now
    assert bm.match_prefix(a + [0]) == pa
    bm.check()


def test_free_pages_are_used_before_cached_ones():
    bm = _bm(num_pages=4)
    pages = _run(bm, "a", list(range(2 * PS)))
    bm.free("a")
    assert bm.allocate("b", 2 * PS)
    assert not set(bm.pages("b")) & set(pages) and bm.num_cached == 2
    bm.check()


def test_identical_pages_computed_twice_are_not_double_registered():
    bm = _bm(num_pages=6)
    toks = list(range(2 * PS)) + [3]
    assert bm.allocate("a", len(toks)) and bm.allocate("b", len(toks))  # admitted together
    bm.commit("a", toks, len(toks))
    bm.commit("b", toks, len(toks))  # b keeps its own pages, unhashed
    bm.check()
    assert bm.match_prefix(toks) == bm.pages("a")[:2]
    bm.free("b")
    assert bm.num_cached == 0  # b's copies went back to the free list
    bm.free("a")
    assert bm.num_cached == 2
    bm.check()


def test_prefix_caching_off_never_hashes():
    bm = _bm(prefix_caching=False)
    toks = list(range(3 * PS))
    assert bm.allocate("a", len(toks))
    bm.commit("a", toks, len(toks))
    bm.free("a")
    assert bm.match_prefix(toks + [1]) == [] and bm.num_cached == 0 and bm.num_free == 8
    bm.check()


@pytest.mark.parametrize("corrupt, message", [
    (lambda bm: bm._ref.__setitem__(bm.pages("a")[0], 2), "ref count"),
    (lambda bm: bm._free.append(bm.pages("a")[0]), "states"),
    (lambda bm: bm._held["a"].append(bm.pages("a")[0]), "twice"),
    (lambda bm: bm._held.__setitem__("b", bm.pages("a")[-1:]) or bm._chain.__setitem__("b", [])
     or bm._ref.__setitem__(bm.pages("a")[-1], 2), "not a cached page"),
    (lambda bm: bm._index.__setitem__(b"x" * 32, 1), "hash"),
])  # fmt: skip
def test_check_catches_a_broken_invariant(corrupt, message):
    bm = _bm()
    _run(bm, "a", list(range(2 * PS)) + [1])
    corrupt(bm)
    with pytest.raises(AssertionError, match=message):
        bm.check()


def test_random_operations_keep_the_invariants():
    """Random match/allocate/commit/free on a small pool, prompts from a few shared stems;
    `check()` after every operation, and what a hit returns always holds the hit's tokens."""
    rng = random.Random(0)
    bm = _bm(num_pages=12)
    content: dict[int, list[int]] = {}  # page -> the tokens its owner computed into it
    live: dict[str, list[int]] = {}
    stems = [[rng.randrange(5) for _ in range(3 * PS)] for _ in range(3)]
    hits = evictions = 0
    for step in range(1500):
        op = rng.random()
        if op < 0.45 or not live:
            toks = rng.choice(stems)[: rng.randrange(1, 3 * PS)] + [rng.randrange(5)
                                                                   for _ in range(rng.randrange(3))]  # fmt: skip
            hit = bm.match_prefix(toks)
            hits += bool(hit)
            for i, p in enumerate(hit):
                assert content[p] == toks[i * PS : (i + 1) * PS]
            rid = f"r{step}"
            cached = bm.num_cached - sum(bm._ref[p] == 0 for p in hit)  # less the revived
            if bm.allocate(rid, len(toks), prefix_pages=hit):
                evictions += bm.num_cached < cached
                for i, p in enumerate(bm.pages(rid)[len(hit) :], start=len(hit)):
                    content[p] = toks[i * PS : (i + 1) * PS]
                bm.commit(rid, toks, rng.randrange(len(hit) * PS, len(toks) + 1))
                live[rid] = toks
        else:
            bm.free(rng.choice(sorted(live)))
            live = {r: t for r, t in live.items() if bm.pages(r)}
        bm.check()
        assert bm.num_free + bm.num_in_use == bm.num_pages
    for rid in list(live):
        bm.free(rid)
    bm.check()
    assert bm.num_in_use == 0
    assert hits > 100 and evictions > 10, (hits, evictions)  # the cases under test happened
