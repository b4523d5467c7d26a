"""What CUTLASS can build, per kernel family: legal configurations, candidate
tiles, the predicates that say whether a family can run a problem class.

``select/`` reads these to choose a kernel and ``emit/`` to check one before
writing its C++, so neither borrows the other's internals. Leaf modules: they
import only the IR.

* ``sm80``: CUTLASS 2.x tensor-core GEMMs and implicit-GEMM convs
  (``cutlass2x_sm80``): dtype / alignment / stage rules, known-good configs,
  the conv activation iterator.
* ``conv_sm90``: CUTLASS 3.x sm90a implicit-GEMM conv (``cutlass3x_sm90``):
  candidate tiles and the TMA im2col limits.
* ``conv_gemm_sm90``: convs lowered onto the sm90 GEMM (direct 1x1, im2col).
* ``depthwise``: the hand-written direct depthwise conv (``direct_depthwise``):
  which depthwise convs it runs, with the reason for the rest.
* ``grouped_conv``: grouped convs (channel groups) on CUTLASS 2.x's grouped
  implicit GEMM: group mode, tile, and the reason for the rest.
* ``attention`` / ``attention_sm90``: the sm80 fused multi-head attention
  (examples/41) and the Hopper FMHA (examples/88): refusals with reasons, tiles,
  and ``attention.choose`` between the two.

The sm90 GEMM family's search space and shape rules live in select/sm90.py (the
choice itself is the table there).
"""
