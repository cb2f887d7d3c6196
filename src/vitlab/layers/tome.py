"""Token Merging (ToMe; Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023), written from the paper.

Section 3 of the paper, as pure functions:

- **bipartite soft matching** (:func:`bipartite_soft_matching`): split the tokens alternately into sets A and B,
  connect each A token to its most similar B token (cosine similarity of the attention keys, averaged over
  heads), keep the ``r`` most similar edges and merge along them. The class token is protected (never merged).
- **size-weighted merging** (:func:`merge_wavg`): a merged token is the size-weighted average of the tokens it
  absorbs, and the sizes add, so a token's size counts the patches it stands for.
- **proportional attention** is the ``size`` argument of :class:`vitlab.layers.attention.Attention` (``log s``
  added to the logits); :meth:`vitlab.layers.block.Block.forward_merging` puts the three together between the
  attention and the MLP of a block, as the paper does.

The reference code is CC-BY-NC; nothing here is taken from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class TokenMatching:
    """Which tokens merge where: the result of :func:`bipartite_soft_matching` for ``N`` tokens.

    All indices are token positions in ``[0, N)``. Set A holds the even positions, set B the odd ones; each
    ``src_pos`` token (in A) merges into the ``dst_pos`` token (in B) at the same index. The tokens left keep
    their original order (the paper concatenates A and B instead; attention does not care about the order, and
    keeping it makes ``r = 0`` the identity and keeps the next block's alternating split spread over the image).

    Attributes:
        kept_pos: ``[B, N - r]`` positions of the tokens left after merging, increasing.
        src_pos: ``[B, r]`` positions of the tokens merged away.
        dst_pos: ``[B, r]`` position of the token each ``src_pos`` token merges into.
        num_tokens: ``N``, the token count before merging.
    """

    kept_pos: torch.Tensor
    src_pos: torch.Tensor
    dst_pos: torch.Tensor
    num_tokens: int

    @property
    def r(self) -> int:
        """Number of tokens removed by this matching."""
        return self.src_pos.shape[1]

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """Add every merged token into its partner and drop it. ``x: [B, N, C] -> [B, N - r, C]``.

        Sums, not means: :func:`merge_wavg` merges ``x * size`` and ``size`` and divides.
        """
        self._check_tokens(x, self.num_tokens)
        x = x.scatter_add(1, _expand(self.dst_pos, x), x.gather(1, _expand(self.src_pos, x)))
        return x.gather(1, _expand(self.kept_pos, x))

    def unmerge(self, x: torch.Tensor) -> torch.Tensor:
        """Every original token gets the value of the token it ended in. ``x: [B, N - r, C] -> [B, N, C]``.

        For instance to map merged features or a per-token label back onto the patch grid.
        """
        self._check_tokens(x, self.num_tokens - self.r)
        full = x.new_zeros(x.shape[0], self.num_tokens, x.shape[2]).scatter(1, _expand(self.kept_pos, x), x)
        return full.scatter(1, _expand(self.src_pos, x), full.gather(1, _expand(self.dst_pos, x)))

    @staticmethod
    def _check_tokens(x: torch.Tensor, expected: int) -> None:
        if x.ndim != 3 or x.shape[1] != expected:
            raise ValueError(f"expected tokens [B, {expected}, C] for this matching, got shape {list(x.shape)}")


def _expand(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B, n] -> [B, n, C]`` index for ``gather``/``scatter`` along the token axis of ``like: [B, N, C]``."""
    return index.unsqueeze(-1).expand(-1, -1, like.shape[-1])


def bipartite_soft_matching(metric: torch.Tensor, r: int, class_token: bool = True) -> TokenMatching:
    """Bipartite soft matching (ToMe, sec. 3 "Token Merging"). ``metric: [B, N, C]`` -> :class:`TokenMatching`.

    1. Partition the tokens alternately into A (even positions) and B (odd positions).
    2. Score every A-B pair by the cosine similarity of their ``metric`` rows (the paper: the keys, averaged
       over heads); each A token keeps an edge to its most similar B token.
    3. Keep the ``r`` most similar edges; their A tokens merge into their B partners (several A tokens may merge
       into the same B token).

    With ``class_token`` the token at position 0 (in A) gets no edge, so it is never merged. ``r`` is capped at
    ``(N - class_token) // 2``, the number of tokens A can give up, so late blocks of a deep model with few tokens
    left merge fewer. The matching is discrete and computed without autograd; gradients flow through the merge.
    """
    if metric.ndim != 3:
        raise ValueError(f"metric must be [B, N, C], got shape {list(metric.shape)}")
    if r < 0:
        raise ValueError(f"r (tokens merged per block) must be >= 0, got {r}")
    batch, num_tokens = metric.shape[:2]
    r = min(r, (num_tokens - int(class_token)) // 2)
    positions = torch.arange(num_tokens, device=metric.device).expand(batch, -1)
    if r == 0:
        return TokenMatching(positions, positions[:, :0], positions[:, :0], num_tokens)
    with torch.no_grad():
        metric = F.normalize(metric, dim=-1)
        scores = metric[:, ::2] @ metric[:, 1::2].transpose(1, 2)  # [B, N_A, N_B]
        if class_token:
            scores[:, 0] = float("-inf")
        best_score, best_dst = scores.max(dim=-1)  # [B, N_A]
        src = best_score.argsort(dim=-1, descending=True)[:, :r]  # indices into A
        src_pos = 2 * src
        dst_pos = 2 * best_dst.gather(1, src) + 1
        # every position except the sources, in order: push the sources to the end, sort, cut
        kept_pos = positions.scatter(1, src_pos, num_tokens).sort(dim=-1).values[:, : num_tokens - r]
    return TokenMatching(kept_pos, src_pos, dst_pos, num_tokens)


def merge_wavg(matching: TokenMatching, x: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Size-weighted average merging (ToMe, sec. 3 "Tracking size"). ``x: [B, N, C]``, ``size: [B, N, 1]``.

    Returns ``(x', size')`` of ``[B, N - r, C]`` and ``[B, N - r, 1]``: a merged token is
    ``sum_i s_i x_i / sum_i s_i`` over the tokens it absorbs and its size is ``sum_i s_i``. The total size and
    the size-weighted mean of the tokens are unchanged.
    """
    if size.shape != (*x.shape[:2], 1):
        raise ValueError(
            f"size must be [B, N, 1] = {[*x.shape[:2], 1]} for tokens {list(x.shape)}, got {list(size.shape)}"
        )
    weighted = matching.merge(x * size)
    size = matching.merge(size)
    return weighted / size, size
