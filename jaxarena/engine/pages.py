"""The KV page pool's bookkeeping: which request holds which pages, which pages are free, and
(with prefix caching) which full pages hold a known run of tokens another request may reuse.

Pure Python, no jax: the runner turns `BlockManager.pages(request_id)` into a block-table row
(page ids, data to the compiled step, so no recompile when they change).

Page ids are 1..num_pages. Page 0 is the NULL page: never allocated, the runner points padding
rows of the block table at it, so the device pool holds `num_pages + 1` pages.

Every page is in exactly one of three states:

- free: no holder, no hash (on the free list);
- cached: no holder, but a hash (its tokens are known; kept for a later prefix hit and
  evicted least recently used when a free page is needed);
- held: by one request, or by several when it is a full cached page they share.

Prefix caching keys a FULL page by a chain hash, sha256 over (the hash of the page before it,
the page's token ids, an extra key such as an adapter name), so a page matches only with
the same whole prefix in front of it (as vLLM's V1 KV cache manager does).
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from collections.abc import Sequence

__all__ = ["BlockManager", "NULL_PAGE", "page_hash"]

NULL_PAGE = 0
"""The page id padding rows of a block table point at; never allocated."""

_ROOT_HASH = hashlib.sha256(b"jaxarena prefix cache").digest()


def page_hash(
    parent: bytes | None, token_ids: Sequence[int], extra_key: str | None = None
) -> bytes:
    """The chain hash of one full page: sha256 over the previous page's hash (None for the
    first page), the page's token ids (as int64) and `extra_key` (e.g. an adapter name; None and
    "" differ). 32 bytes."""
    h = hashlib.sha256(_ROOT_HASH if parent is None else parent)
    if extra_key is None:
        h.update(b"\x00")
    else:
        key = str(extra_key).encode()
        h.update(b"\x01" + len(key).to_bytes(4, "little") + key)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockManager:
    """Pages of a paged KV pool handed to requests `page_size` tokens at a time.

    Args:
      num_pages: allocatable pages (ids 1..num_pages; the device pool holds one more, page 0).
      page_size: tokens per page (the kernels' `kv_block_size`).
      prefix_caching: keep full computed pages under a hash of their prefix and share them
        between requests (attention-only models; off for recurrent hybrids, whose state at a
        page boundary is not in the page).

    Every operation is O(pages it touches); eviction takes the least recently freed cached
    page in O(1) (an insertion-ordered dict).
    """

    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool) -> None:
        for name, value in (("num_pages", num_pages), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        self.num_pages = num_pages
        self.page_size = page_size
        self.prefix_caching = bool(prefix_caching)
        self._ref = [0] * (num_pages + 1)
        self._hash: list[bytes | None] = [None] * (num_pages + 1)
        self._index: dict[bytes, int] = {}
        self._free: collections.deque[int] = collections.deque(range(1, num_pages + 1))
        # Unreferenced pages with a hash, least recently freed first (evicted first).
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._held: dict[str, list[int]] = {}
        # Chain hashes of each request's leading full computed pages (what `commit` has seen);
        # the last one is the parent of the next page's hash.
        self._chain: dict[str, list[bytes]] = {}

    # ----------------------------------------------------------------------- counts
    @property
    def num_free(self) -> int:
        """Pages an allocation can have now: free ones plus evictable cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_in_use(self) -> int:
        """Pages held by at least one request (a shared page counts once)."""
        return self.num_pages - self.num_free

    @property
    def num_cached(self) -> int:
        """Unreferenced pages that keep a hash (a later prefix hit may revive them)."""
        return len(self._cached)

    def num_pages_for(self, num_tokens: int) -> int:
        """Pages that cover `num_tokens` tokens: ceil(num_tokens / page_size)."""
        return -(-num_tokens // self.page_size)

    def pages(self, request_id: str) -> list[int]:
        """The request's pages in token order (its block-table row; a copy). [] if it holds
        none."""
        return list(self._held.get(request_id, ()))

    # ----------------------------------------------------------------------- prefix
    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> list[int]:
        """The pages of the longest cached run of full pages that starts `token_ids`.

        Capped so at least one token of `token_ids` is left to compute (the step must produce
        the logits of the last token; a full hit recomputes it, as vLLM does), i.e. at most
        `(len(token_ids) - 1) // page_size` pages. Takes no references: pass the result to
        `allocate` before anything else allocates. [] without prefix caching.
        """
        if not self.prefix_caching:
            return []
        ps = self.page_size
        out: list[int] = []
        parent = None
        for i in range((len(token_ids) - 1) // ps):
            parent = page_hash(parent, token_ids[i * ps : (i + 1) * ps], extra_key)
            page = self._index.get(parent)
            if page is None:
                break
            out.append(page)
        return out

    # ----------------------------------------------------------------------- allocate
    def allocate(self, request_id: str, num_tokens: int, prefix_pages: Sequence[int] = ()) -> bool:
        """Make `request_id` hold pages covering its first `num_tokens` tokens.

        `prefix_pages` (the request's first call only): pages from `match_prefix`, taken first
        by reference (they then cover `len(prefix_pages) * page_size` tokens). New pages come
        from the free list, else by evicting the least recently used cached page. All or
        nothing: returns False, with nothing changed, when the free pages are not enough.
        Holding enough already is True and a no-op.
        """
        held = self._held.get(request_id)
        if held is not None and not prefix_pages and len(held) * self.page_size >= num_tokens:
            return True  # the common decode step: the last page still has room
        if prefix_pages:
            if held:
                raise ValueError(f"allocate({request_id!r}): prefix_pages are for the request's "
                                 f"first allocation; it already holds {len(held)} pages")  # fmt: skip
            for p in prefix_pages:
                if not 1 <= p <= self.num_pages or self._hash[p] is None:
                    raise ValueError(f"allocate({request_id!r}): prefix page {p} is not a cached "
                                     "page (use the result of match_prefix unchanged)")  # fmt: skip
            if len(set(prefix_pages)) != len(prefix_pages):
                raise ValueError(f"allocate({request_id!r}): prefix_pages {list(prefix_pages)} "
                                 "repeat a page")  # fmt: skip
        have = len(held) if held else len(prefix_pages)
        need = max(0, self.num_pages_for(num_tokens) - have)
        # Prefix pages revived from the cache are no longer available to the new pages.
        revived = sum(1 for p in prefix_pages if self._ref[p] == 0)
        if need > self.num_free - revived:
            return False
        if held is None:
            held = self._held[request_id] = []
            self._chain[request_id] = []
        for p in prefix_pages:
            if self._ref[p] == 0:
                del self._cached[p]
            self._ref[p] += 1
            held.append(p)
            self._chain[request_id].append(self._hash[p])
        for _ in range(need):
            held.append(self._take())
        return True

    def _take(self) -> int:
        if self._free:
            page = self._free.popleft()
        else:
            page, _ = self._cached.popitem(last=False)
            del self._index[self._hash[page]]
            self._hash[page] = None
        self._ref[page] = 1
        return page

    # ----------------------------------------------------------------------- commit
    def commit(self, request_id: str, token_ids: Sequence[int], num_computed: int,
               extra_key: str | None = None) -> None:  # fmt: skip
        """Register the hashes of the request's pages that are now full and computed.

        `token_ids`: the request's tokens so far (prompt + output); `num_computed`: how many
        of them have their KV in the pages. Pages already registered are skipped, so calling
        it every step costs O(new full pages). When an identical page is already cached
        (another request computed the same prefix at the same time), the request keeps its
        own page unhashed: no copy, no double registration. A no-op without prefix caching.
        """
        if not self.prefix_caching:
            return
        held = self._held.get(request_id)
        if held is None:
            raise KeyError(f"commit({request_id!r}): the request holds no pages")
        chain = self._chain[request_id]
        ps = self.page_size
        full = min(num_computed, len(token_ids)) // ps
        if full > len(held):
            raise ValueError(f"commit({request_id!r}): num_computed={num_computed} covers "
                             f"{full} full pages but the request holds {len(held)}")  # fmt: skip
        for i in range(len(chain), full):
            h = page_hash(chain[-1] if chain else None, token_ids[i * ps : (i + 1) * ps],
                          extra_key)  # fmt: skip
            chain.append(h)
            page = held[i]
            if h not in self._index and self._hash[page] is None:
                self._index[h] = page
                self._hash[page] = h

    # ----------------------------------------------------------------------- free
    def free(self, request_id: str) -> None:
        """Release all the request's pages, the last page first: a page nobody else holds
        becomes cached (it has a hash; the request's tail is then evicted before its head, so
        a resumed request still finds its prefix) or free. Unknown ids are a no-op."""
        held = self._held.pop(request_id, None)
        self._chain.pop(request_id, None)
        for page in reversed(held or ()):
            self._ref[page] -= 1
            if self._ref[page] == 0:
                if self._hash[page] is not None:
                    self._cached[page] = None
                else:
                    self._free.append(page)

    # ----------------------------------------------------------------------- invariants
    def check(self) -> None:
        """Assert the invariants (AssertionError naming the first broken one): every page is
        exactly one of free, cached or held; reference counts equal the holders; no request
        holds a page twice; a page held by two requests is a shared full cached page; the hash
        index and the pages' hashes agree; page 0 is never handed out."""
        holders = [0] * (self.num_pages + 1)
        for rid, held in self._held.items():
            assert len(set(held)) == len(held), f"request {rid!r} holds a page twice: {held}"
            assert len(self._chain[rid]) <= len(held), f"request {rid!r}: more hashes than pages"
            for p in held:
                assert 1 <= p <= self.num_pages, f"request {rid!r} holds page {p} (not 1..N)"
                holders[p] += 1
        free = set(self._free)
        assert len(free) == len(self._free), "the free list repeats a page"
        assert NULL_PAGE not in free and NULL_PAGE not in self._cached, "page 0 is allocatable"
        assert self._ref[NULL_PAGE] == 0 and self._hash[NULL_PAGE] is None, "page 0 is used"
        for p in range(1, self.num_pages + 1):
            ref, h = self._ref[p], self._hash[p]
            assert ref == holders[p], f"page {p}: ref count {ref} but {holders[p]} holders"
            states = (p in free) + (p in self._cached) + (ref > 0)
            assert states == 1, (f"page {p} is in {states} of the states free/cached/held "
                                 f"(ref {ref}, free {p in free}, cached {p in self._cached})")  # fmt: skip
            if p in free:
                assert h is None, f"free page {p} keeps a hash"
            if p in self._cached:
                assert h is not None, f"cached page {p} has no hash"
            if ref > 1:
                assert h is not None, f"page {p} is held by {ref} requests but is not a cached page"
            if h is not None:
                assert self._index.get(h) == p, f"page {p}'s hash maps to {self._index.get(h)}"
        for h, p in self._index.items():
            assert self._hash[p] == h, f"the hash index maps to page {p}, which has another hash"
        if not self.prefix_caching:
            assert not self._index, "hashes registered with prefix caching off"
