"""CUTLASS 3.x sm90a (TMA warp-specialized) GEMM configs: the search space, the
learned table, and the shape rules.

3.x kernels need 16-byte aligned operands (TMA), so they serve f16/bf16 problems
with alignment 8 everywhere; the rest go to the 2.x kernels (select/sm80.py).

How a problem gets its kernel without a GPU (``choose``):

1. the learned table (``select/tables/sm90a_*.json``, written by
   ``benchmarks/kernels_bench.py --write-table`` from a profile of the kernel corpus on
   the GPU it names): the measured winner (config and launch knobs) for the same
   (M, N, K, batch, B layout), or for the nearest profiled shape within a factor
   of ``NEAREST_MAX_RATIO`` in each of M, N and K (log-space distance); used only
   for the SM count it was measured on;
2. else the shape rules below (``choose_name``), with ``DEFAULT_LAUNCH``.

The shape rules, six configs (the CTA-count argument and the --tune profiles of
the built-in models on an H200, CUDA-graph timing, us):

========  ==============  =======  ===========  ============================================
name      tile (M, N, K)  cluster  schedule     for
========  ==============  =======  ===========  ============================================
big       128x256x64      2x1      cooperative  N > 128 and 1.5 waves of CTAs or more (4096^3:
                                                638 TFLOP/s)
mid       128x128x64      1x1      cooperative  M > 1024 and half a wave of 128x128 tiles
small     64x128x64       1x1      ping-pong    M <= 1024 (below 1.5 waves of big tiles), or few
                                                tiles
wide      64x256x64       1x1      ping-pong    small M with a wide N (a wave of 64x256 tiles)
narrow    128x64x64       1x1      cooperative  N <= 64, M > 128 (a wider tile would be half empty
                                                or more; before "big", since a lowered conv's
                                                huge M with N = 16-64 took it)
stream_k  128x128x64      1x1      cooperative  a --tune candidate only
                                   + stream-K
========  ==============  =======  ===========  ============================================

* 64x128 ping-pong beat 128x128 cooperative on every M <= 1024 GEMM profiled:
  BERT/GPT-2 1024x3072x768 16.3 vs 18.1, 1024x2304x768 11.2 vs 13.1,
  1024x768x3072 12.7 vs 19.0, 1024x768x768 5.8 vs 7.4;
* 128x256 lost to it at 1.2 waves (UNet 512x10240x1280: 32.2 vs 24.3) and tied
  128x128 at 2.4 waves (2048x5120x640: 28.2 vs 27.6): big needs 1.5 waves;
* stream-K with CUTLASS's heuristic decomposition lost on all nine problems it was
  profiled on (UNet 128x1280x5120: 31.5 vs 16.6 for ping-pong).

``SPACE`` is what ``--tune`` and the corpus profile search: tile shapes from 64x64
to 256x128 (N = 96 and 192 included), cooperative and ping-pong schedules, clusters
1x1, 2x1, 1x2 and 2x2, 128-deep K tiles for small tiles, and stream-K kernels
whose splits and decomposition are run-time knobs (``launch_variants``), as are
raster order, swizzle and PDL for every kernel (ir.GemmLaunch): trying a knob costs
no compile. What each config costs to build shows in the build report (seconds per
unit and the kernels it holds).

To ``SPACE`` the search adds tiles fitted to the problem's waves
(``fitted_configs``), as cuBLAS fits its tiles (llama's 2048x5632x2048 on 176x128,
four waves on 132 SMs): a tile N of a multiple of 16 from 64 to 256 on a wgmma as
wide as the tile (emit/sm90_parts.wgmma_selector; since session 22); 192-row N-split
tiles (``_n_split_configs``, session 24: cuBLAS's shape for whisper's 6000 x 768);
swap_ab configs (the kernel computes D^T) with the tile N fitted to few rows
(``swap_configs``, session 28: the UNet's 154x24960x768) or, for many rows, to M
(``_swap_fitted_configs``, session 52: cuBLAS runs convnext-tiny's 1568x768x3072 on
128-wide tiles along N and 80 along M); skinny tiles for many rows with a narrow N or
short K (``skinny_configs``, session 28: EfficientNet's 1x1 convs); clusters of 2 to 8
CTAs for few tiles and a long K (``multicast_configs``, session 51: TMA multicast, the
persistent grid sized from the clusters the device holds,
emit/templates/cluster_occupancy.h). The rules never choose these: only table entries
do. What each won and lost, with the runs: docs/measured.md, the sessions named.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from ..ir import GemmLaunch, GemmProblem, KernelConfig, config_from_dict

COOP = "KernelTmaWarpSpecializedCooperative"
PINGPONG = "KernelTmaWarpSpecializedPingpong"


def _config(tile, cluster, sched, scheduler="persistent", n_split=False, swap_ab=False) -> KernelConfig:
    warp = (tile[0], tile[1] // 2, tile[2]) if n_split else (0, 0, 0)
    return KernelConfig("cutlass3x_sm90", tile, stages=0, cluster=cluster, kernel_schedule=sched,
                        tile_scheduler=scheduler, warp=warp, swap_ab=swap_ab)


CONFIGS = {
    "big": _config((128, 256, 64), (2, 1, 1), COOP),
    "mid": _config((128, 128, 64), (1, 1, 1), COOP),
    "small": _config((64, 128, 64), (1, 1, 1), PINGPONG),
    "wide": _config((64, 256, 64), (1, 1, 1), PINGPONG),
    "narrow": _config((128, 64, 64), (1, 1, 1), COOP),
    "stream_k": _config((128, 128, 64), (1, 1, 1), COOP, "stream_k"),
}

_C11, _C21, _C12, _C22 = (1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1)
# The searched configs (tile, cluster, schedule, tile scheduler). Ping-pong gives
# each consumer warp group a whole tile, so its tile M stays <= 128 with N <= 128
# for 128-row tiles (128 fp32 accumulators per thread).
SPACE = tuple(dict.fromkeys([
    *CONFIGS.values(),
    # cooperative: two consumer warp groups split the tile's rows (tile M >= 128)
    _config((128, 64, 64), _C21, COOP),
    _config((128, 96, 64), _C11, COOP),
    _config((128, 128, 64), _C21, COOP),
    _config((128, 128, 64), _C12, COOP),
    _config((128, 128, 64), _C22, COOP),
    _config((128, 192, 64), _C11, COOP),
    _config((128, 192, 64), _C21, COOP),
    _config((128, 256, 64), _C11, COOP),
    _config((128, 256, 64), _C12, COOP),
    _config((256, 128, 64), _C11, COOP),
    _config((256, 128, 64), _C21, COOP),
    _config((256, 128, 64), _C12, COOP),
    _config((256, 128, 64), _C22, COOP),
    _config((128, 128, 128), _C11, COOP),
    # ping-pong: two consumer warp groups alternate whole tiles (epilogue overlaps MMA)
    _config((64, 64, 64), _C11, PINGPONG),
    _config((64, 64, 128), _C11, PINGPONG),
    _config((64, 128, 64), _C21, PINGPONG),
    _config((64, 128, 64), _C12, PINGPONG),
    _config((64, 128, 128), _C11, PINGPONG),
    _config((64, 192, 64), _C11, PINGPONG),
    _config((64, 256, 64), _C12, PINGPONG),
    _config((128, 64, 64), _C11, PINGPONG),
    _config((128, 128, 64), _C11, PINGPONG),
    _config((128, 128, 64), _C21, PINGPONG),
    # stream-K scheduler (cooperative only): splits / decomposition are launch knobs
    _config((128, 64, 64), _C11, COOP, "stream_k"),
    _config((128, 256, 64), _C11, COOP, "stream_k"),
]))

SMALL_M = 128            # rows: up to here a 64-row ping-pong tile wastes least
PINGPONG_MAX_M = 1024    # rows: up to here 64x128 ping-pong beat 128x128 cooperative (measured)
BIG_MIN_WAVES = 1.5      # waves of 128x256 tiles below which they lost (measured)
MAX_CANDIDATES = 4       # configs a --tune profiles per problem when not searching SPACE
# Launch knobs for shapes the table does not cover: CUTLASS's defaults.
DEFAULT_LAUNCH = GemmLaunch()
NEAREST_MAX_RATIO = 2.0  # a table entry stands in for shapes within 2x in each of M, N, K
TABLES = Path(__file__).parent / "tables"


def supports(problem: GemmProblem) -> bool:
    """True when a 3.x TMA kernel can run this problem class at all (``refusal`` says
    why not)."""
    return refusal(problem) is None


def refusal(problem: GemmProblem) -> str | None:
    """Why no 3.x TMA kernel can run the problem (None when one can), in words for the
    report: the region then runs a CUTLASS 2.x (sm80) kernel on sm_90a."""
    if problem.dtype not in ("f16", "bf16"):
        return f"{problem.dtype} operands (the TMA kernels take f16 / bf16)"
    aligns = (problem.align_a, problem.align_b, problem.align_c)
    if aligns != (8, 8, 8):
        return (f"A / B / C aligned to {'/'.join(map(str, aligns))} elements (the TMA kernels "
                "need 16-byte rows: sizes and strides multiples of 8)")
    if problem.a_batch_broadcast:
        return "A broadcast over the batch (stride 0)"
    return None


def gemm_mnk(problem: GemmProblem) -> tuple:
    """(M, N, K) the tiles cover: the example's rows, times the batch for a batched
    GEMM (every batch entry is tiled on its own)."""
    return problem.rows, problem.n, problem.k


def tiled_mn(problem: GemmProblem, config: KernelConfig) -> tuple:
    """(rows, columns) of the output ``config``'s tiles cover: (M, N) of gemm_mnk, or
    (N, M) for a swap_ab config (its tile M runs along the problem's N)."""
    m, n, _ = gemm_mnk(problem)
    return (n, m) if config.swap_ab else (m, n)


def _ctas(problem: GemmProblem, config: KernelConfig) -> int:
    m, n = tiled_mn(problem, config)
    tm, tn, _ = config.tile
    return math.ceil(m / tm) * math.ceil(n / tn)


def choose_name(problem: GemmProblem, num_sms: int) -> str:
    """The shape rules' config name (a key of ``CONFIGS``); see the module docstring."""
    m, n, _ = gemm_mnk(problem)
    if m <= SMALL_M:
        return "wide" if n >= 256 and _ctas(problem, CONFIGS["wide"]) >= num_sms else "small"
    if n <= 64:
        return "narrow"     # a 256-wide N tile would be three quarters empty
    if n > 128 and _ctas(problem, CONFIGS["big"]) >= BIG_MIN_WAVES * num_sms:
        return "big"
    if m > PINGPONG_MAX_M and _ctas(problem, CONFIGS["mid"]) >= num_sms // 2:
        return "mid"
    return "small"


class Table:
    """A learned table: measured winners per GEMM shape on one GPU.

    File (JSON): {"gpu", "num_sms", "date", "cutlass", "source", "entries": [{"m", "n",
    "k", "batch", "layout_b", optional "layout_a" (default "row"), "config":
    ir.KernelConfig fields, "launch":
    ir.GemmLaunch fields, "us", "anchor_us", optional "residual": {"config", "launch",
    "us", "from"}}]}; ``m`` counts the rows of one batch entry. Entries are keyed by
    shape and the A and B layouts (a column-major A, the VAE's attention projections
    read through a transpose, loads its tiles MN-major and wins with other tiles:
    4096x1536x512 ran 15.8 us on the rules' 128x128 cooperative tile and 12.75 on 128x128
    ping-pong, kernels_worst_plain_search_2026-12-04_h200.json); one winner serves every
    epilogue and both 16-bit dtypes
    (wgmma runs fp16 and bf16 at one rate; the corpus run measured the table's choices
    at 1.10x cuBLAS geomean for fp16 and 1.08x for bf16 plain GEMMs, 1.21x / 1.19x
    fused), except that an entry's "residual" winner, where the profile measured one
    apart, serves the epilogues that read a source C: reading C through the epilogue
    changes which tile wins (llama's 2048x5632x2048: 128x176 tiles ran the plain GEMM
    at 67.7 us and the one with a fused SiLU-multiply at 100.6, 128x128 ping-pong that
    one at 82.3; kernels_fitted_2026-12-03_h200.json). Raises ValueError (from the
    config classes) or KeyError / TypeError for a file of another shape.
    """

    def __init__(self, data: dict):
        self.gpu, self.num_sms = data["gpu"], int(data["num_sms"])
        self.meta = {k: v for k, v in data.items() if k != "entries"}
        self.entries, self.residual = {}, {}
        for e in data["entries"]:
            key = (int(e["m"]) * max(1, int(e.get("batch", 1))), int(e["n"]), int(e["k"]),
                   e["layout_b"], e.get("layout_a", "row"))
            self.entries[key] = (config_from_dict(e["config"]), GemmLaunch(**e.get("launch", {})))
            if "residual" in e:
                r = e["residual"]
                self.residual[key] = (config_from_dict(r["config"]), GemmLaunch(**r.get("launch", {})))

    @classmethod
    def load(cls, path) -> Table:
        return cls(json.loads(Path(path).read_text()))

    def lookup(self, problem: GemmProblem, num_sms: int):
        """(KernelConfig, GemmLaunch) for ``problem``, or None: the entry of the exact
        shape, else of the nearest profiled one within NEAREST_MAX_RATIO in M, N and K;
        its "residual" winner when ``problem``'s epilogue reads a source C and the
        entry has one."""
        key = self._key(problem, num_sms)
        if key is None:
            return None
        if problem.epilogue.residual != "none" and key in self.residual:
            return self.residual[key]
        return self.entries[key]

    def _key(self, problem: GemmProblem, num_sms: int):
        """The key of the entry that serves ``problem``, or None."""
        if num_sms != self.num_sms:
            return None
        m, n, k = gemm_mnk(problem)
        exact = (m, n, k, problem.layout_b, problem.layout_a)
        if exact in self.entries:
            return exact
        best, best_d = None, None
        limit = math.log(NEAREST_MAX_RATIO) + 1e-9
        for key in self.entries:
            em, en, ek, lay_b, lay_a = key
            if (lay_b, lay_a) != (problem.layout_b, problem.layout_a):
                continue       # a nearest shape of the other layouts is no guide
            ds = [abs(math.log(a / b)) for a, b in ((m, em), (n, en), (k, ek))]
            if max(ds) > limit:
                continue
            d = sum(ds)
            if best_d is None or d < best_d or (d == best_d and key < best):
                best, best_d = key, d
        return best


TABLE_FILE = TABLES / "sm90a_h200.json"


@functools.cache
def default_table() -> Table | None:
    """The learned table ``choose`` reads by default: the packaged one
    (``TABLE_FILE``) or the one ``use_table`` named; None when there is none."""
    return Table.load(TABLE_FILE) if TABLE_FILE.exists() else None


def use_table(path) -> None:
    """Read the learned table from ``path`` from now on (a profile run that has just
    written one; tests)."""
    global TABLE_FILE
    TABLE_FILE = Path(path)
    default_table.cache_clear()


def choose(problem: GemmProblem, num_sms: int, table: Table | None | bool = True) -> tuple:
    """(KernelConfig, GemmLaunch) for ``problem`` on a device with ``num_sms`` SMs:
    the learned table's entry when it has one (``table``: True = the packaged
    table, None / False = rules only, or a Table), else the shape rules' config
    with DEFAULT_LAUNCH."""
    table = default_table() if table is True else (table or None)
    hit = table.lookup(problem, num_sms) if table is not None else None
    if hit is not None and takes(problem, hit[0]):
        return hit
    return CONFIGS[choose_name(problem, num_sms)], DEFAULT_LAUNCH


def takes(problem: GemmProblem, config: KernelConfig) -> bool:
    """Whether ``problem`` (a GemmProblem, or a GemmKernel: its dtype, layouts and
    epilogue are read) can run on ``config`` as far as the kind of kernel goes: an
    N-split or swap_ab config (emit/gemm_sm90.py) only for f16 / bf16 without a GLU
    epilogue, swap_ab only with K contiguous in A and B (a table entry measured on one
    problem serves its neighbours)."""
    if not (config.n_split or config.swap_ab):
        return True
    if problem.dtype not in ("f16", "bf16") or problem.epilogue.glu:
        return False
    return not config.swap_ab or (problem.layout_a, problem.layout_b) == ("row", "col")


def _plausible_rule(problem: GemmProblem, name: str, num_sms: int) -> bool:
    """Whether profiling a rules config could pay off (cheap filters only)."""
    m, n, k = gemm_mnk(problem)
    return {
        "big": m > 64 and _ctas(problem, CONFIGS["big"]) * 4 >= num_sms,
        "mid": m > 64,
        "small": True,
        "stream_k": k >= 512 and _ctas(problem, CONFIGS["mid"]) < 2 * num_sms,
        "wide": m <= 2 * SMALL_M and n >= 256,
        "narrow": n <= 128 and m > 64,
    }[name]


def candidates(problem: GemmProblem, num_sms: int) -> tuple:
    """At most ``MAX_CANDIDATES`` rules configs to profile: the heuristic's first,
    then the plausible others in ``CONFIGS`` order (a quick --tune)."""
    first = choose_name(problem, num_sms)
    names = [first] + [n for n in CONFIGS if n != first and _plausible_rule(problem, n, num_sms)]
    return tuple(CONFIGS[n] for n in names[:MAX_CANDIDATES])


def plausible(problem: GemmProblem, config: KernelConfig, num_sms: int) -> bool:
    """Whether ``config`` could win on ``problem`` (cheap filters, no profile): a
    tile not mostly empty in M or N, at least an eighth of a wave of CTAs unless
    the problem has fewer tiles than that for every tile, a cluster that fits the
    tile grid, stream-K only with K >= 512 and under two waves of tiles."""
    m, n = tiled_mn(problem, config)
    k = problem.k
    tm, tn, tk = config.tile
    cm, cn, _ = config.cluster
    if tm > 64 and m <= tm // 2 or tn > 64 and n <= tn // 2:
        return False
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    if (cm > 1 and tiles_m < cm) or (cn > 1 and tiles_n < cn):
        return False
    if tiles_m * tiles_n < num_sms // 8 and math.ceil(m / 64) * math.ceil(n / 64) >= num_sms // 8 \
            and tm * tn > 64 * 128:
        return False
    if tk > 64 and k < 4 * tk:
        return False
    if config.tile_scheduler == "stream_k":
        return k >= 512 and tiles_m * tiles_n < 2 * num_sms
    return True


def search_space(problem: GemmProblem, num_sms: int) -> tuple:
    """The configs worth profiling on ``problem``: the heuristic's choice first,
    then every plausible one of ``SPACE`` (``plausible``) in SPACE order, then the
    tiles fitted to its waves (``fitted_configs``)."""
    first, _ = choose(problem, num_sms)
    out = (first,) + tuple(c for c in SPACE if c != first and plausible(problem, c, num_sms))
    return out + tuple(c for c in fitted_configs(problem, num_sms) if c not in out)


# Wave-fitted tiles (fitted_configs). wgmma takes any N that is a multiple of 8 up to
# 256; tiles outside CuTe's default shapes compile with its extended ones
# (emit/sm90_parts.wgmma_selector); multiples of 16 so that TMA rows stay 32-byte wide.
FIT_TILE_N = tuple(range(64, 257, 16))
FIT_PER_M = 2            # fitted tile Ns proposed per tile M
FIT_MIN_GAIN = 1.03      # estimated gain over the best fixed tile of that M to propose one
FIT_I0 = 16.0            # intensity (MACs per element loaded) at which a tile runs at half rate
_FIXED_N = {64: (64, 128, 192, 256), 128: (64, 96, 128, 192, 256)}   # SPACE's tile Ns


def tile_estimate(m: int, n: int, tm: int, tn: int, num_sms: int) -> float:
    """Relative device time of an (m, n) output computed in tm x tn tiles, per unit
    of K: whole waves of CTAs (a persistent kernel's last wave costs a full one)
    times one tile's time, tm * tn MACs at a rate that grows with the tile's
    arithmetic intensity I = tm * tn / (tm + tn) as I / (I + FIT_I0): a roofline
    of our own, only good for ranking tiles of one problem (it proposes search
    candidates; profiles decide)."""
    waves = math.ceil(math.ceil(m / tm) * math.ceil(n / tn) / num_sms)
    intensity = tm * tn / (tm + tn)
    return waves * tm * tn * (intensity + FIT_I0) / intensity


def _fitted_ns(m: int, n: int, tm: int, tile_ns, bound: float, num_sms: int) -> list:
    """Of ``tile_ns`` (none of 2n or more), the ``FIT_PER_M`` with the smallest
    ``tile_estimate`` of an (m, n) output in tm-row tiles, kept where that estimate
    beats ``bound`` by ``FIT_MIN_GAIN``; smallest estimate first."""
    ranked = sorted((tile_estimate(m, n, tm, tn, num_sms), tn) for tn in tile_ns if not tn >= 2 * n)
    return [tn for est, tn in ranked[:FIT_PER_M] if est * FIT_MIN_GAIN <= bound]


def _best_fixed(m: int, n: int, num_sms: int) -> float:
    """The smallest ``tile_estimate`` of SPACE's fixed tiles (64 and 128 rows)."""
    return min(tile_estimate(m, n, tm, tn, num_sms) for tm in _FIXED_N for tn in _FIXED_N[tm])


def fitted_configs(problem: GemmProblem, num_sms: int) -> tuple:
    """Configs whose tile N is fitted to ``problem``'s waves on ``num_sms`` SMs.

    For tile M 128 (cooperative, clusters 1x1 and 2x1) and 64 (ping-pong, 1x1):
    the ``FIT_PER_M`` tile Ns of ``FIT_TILE_N`` outside SPACE with the smallest
    ``tile_estimate``, each only when it beats the best of SPACE's tile Ns for
    that M by ``FIT_MIN_GAIN``; then the 192-row N-split tiles (``_n_split_configs``),
    the swap_ab ones (``swap_configs``), the skinny ones (``skinny_configs``) and the
    multicast ones (``multicast_configs``). None
    of the first, second and fourth kind for M <= 128 rows (one tile row: the fixed
    small tiles cover it) or an N-contiguous B (its shared-memory swizzle needs N
    in multiples of 64 for full width). Returns a tuple of KernelConfig.
    """
    m, n, _ = gemm_mnk(problem)
    swapped = swap_configs(problem, num_sms)
    if m <= SMALL_M or problem.layout_b != "col":
        return swapped
    out = []
    for tm, sched, clusters in ((128, COOP, (_C11, _C21)), (64, PINGPONG, (_C11,))):
        best_fixed = min(tile_estimate(m, n, tm, tn, num_sms) for tn in _FIXED_N[tm])
        for tn in _fitted_ns(m, n, tm, [t for t in FIT_TILE_N if t not in _FIXED_N[tm]],
                             best_fixed, num_sms):
            tiles_m = math.ceil(m / tm)
            out += [_config((tm, tn, 64), c, sched) for c in clusters if c[0] <= tiles_m]
    n_split = _n_split_configs(m, n, num_sms)
    multicast = tuple(c for c in multicast_configs(problem, num_sms) if c not in out)
    return (tuple(out) + tuple(c for c in n_split if takes(problem, c)) + swapped
            + _swap_fitted_configs(problem, num_sms) + skinny_configs(problem, num_sms)
            + multicast)


# Multicast clusters: a problem of few output tiles and a long K (the UNet's 512 x 3840 x
# 1280) is bound by what its CTAs load from L2, as each reads its own A and B panels;
# in a cluster of cm x cn CTAs a B panel is loaded once for the cm CTAs along M (TMA
# multicast) and an A panel once for the cn along N. cuBLAS ran that problem on
# 128x128 tiles in a 2x4 cluster on the H200 (nvjet_sm90_hsh_128x128_64x6_2x4, 9.3 us
# against our 10.4-11.4 on 128x64 in 1x1; cublas_kernel_names_2026-12-04_h200_s29.log).
# Session 29 measured ours in such clusters at 12.2-17.9 us: then CUTLASS sized their
# persistent grid for GPCs of 18 SMs (112 CTAs for clusters of 8 on 132 SMs, two waves
# for 120 tiles); they now launch as many clusters as the device holds
# (emit/templates/cluster_occupancy.h).
MULTICAST_MIN_K = 1024     # K from which the search proposes them
MULTICAST_MAX_WAVES = 2    # at most this many waves of 128x128 tiles
# (tile, schedule, cluster): the ones that won or came within 10% on an H100 in session 51
# (kernels_multicast*_2026-12-07_h100_s51.json); 64x64 / 64x80 ping-pong in clusters and
# 1x2 / 1x4 clusters won nowhere, and each candidate is a compile in every --tune
MULTICAST_CONFIGS = (((128, 128, 64), COOP, (4, 2, 1)), ((128, 128, 64), COOP, (2, 2, 1)),
                     ((128, 128, 64), COOP, (4, 1, 1)), ((128, 64, 64), COOP, (2, 4, 1)),
                     ((64, 128, 64), PINGPONG, (4, 1, 1)), ((64, 128, 64), PINGPONG, (2, 1, 1)))


def multicast_configs(problem: GemmProblem, num_sms: int) -> tuple:
    """``MULTICAST_CONFIGS`` (clusters of 2 to 8 CTAs: TMA multicast of the A and B
    panels) for a problem of at most ``MULTICAST_MAX_WAVES`` waves of 128x128 tiles
    and K >= ``MULTICAST_MIN_K``, each only where its cluster divides the tile grid
    (no CTA of a cluster left without a tile) and ``plausible`` holds; f16 / bf16,
    K-contiguous A and B, one batch entry. Else ()."""
    m, n, k = gemm_mnk(problem)
    if (k < MULTICAST_MIN_K or problem.batch != 1 or problem.dtype not in ("f16", "bf16")
            or (problem.layout_a, problem.layout_b) != ("row", "col")
            or math.ceil(m / 128) * math.ceil(n / 128) > MULTICAST_MAX_WAVES * num_sms):
        return ()
    out = []
    for tile, sched, cluster in MULTICAST_CONFIGS:
        tiles_m, tiles_n = math.ceil(m / tile[0]), math.ceil(n / tile[1])
        if tiles_m % cluster[0] or tiles_n % cluster[1]:
            continue
        c = _config(tile, cluster, sched)
        if plausible(problem, c, num_sms):
            out.append(c)
    return tuple(out)


# Skinny tiles: memory-bound GEMMs of many rows and a narrow N or a short K (the 1x1
# convs of EfficientNet's early stages: 401408 x 16 x 32, 401408 x 96 x 16)
SKINNY_MIN_M = 8192      # rows from which the search proposes them
SKINNY_MAX_K = 48        # a K up to this is one K tile (rounded up to 16)
SKINNY_MAX_N = 48        # an N up to this is one N tile (rounded up to 16)


def skinny_configs(problem: GemmProblem, num_sms: int) -> tuple:
    """Configs whose tile N and K fit a skinny problem's N and K (rounded up to 16)
    instead of the fixed 64-deep K tile and 64-wide-or-more N tiles, so that a
    tile's shared memory and MMAs hold no padding and more tiles stay in flight:
    rows of 64 and 128 (ping-pong), 128 and 256 (cooperative), cluster 1x1. Where
    the table's tiles ran such problems on the H200: 401408 x 16 x 32 30.3 us on
    128x64 against cuBLAS's 16.4 (kernels_lowered_conv_gemm_search_2026-12-01).
    For M >= SKINNY_MIN_M with K <= SKINNY_MAX_K or N <= SKINNY_MAX_N; else ()."""
    m, n, k = gemm_mnk(problem)
    if m < SKINNY_MIN_M or (k > SKINNY_MAX_K and n > SKINNY_MAX_N) or n > 256:
        return ()
    tn, tk = max(16, -(-n // 16) * 16), max(16, min(64, -(-k // 16) * 16))
    # at most 128 fp32 accumulators per consumer thread (a ping-pong warp group holds
    # a whole tile, the cooperative ones half of it each)
    return tuple(_config((tm, tn, tk), _C11, sched)
                 for tm, sched in ((64, PINGPONG), (128, PINGPONG), (128, COOP), (256, COOP))
                 if tm * tn <= (128 if sched == PINGPONG else 256) * 128)


# swap_ab configs (KernelConfig.swap_ab): D^T = B^T A^T, the tile's N fitted to M
SWAP_MAX_M = 256         # rows up to which the search proposes them (one or two tile Ns)


def swap_configs(problem: GemmProblem, num_sms: int) -> tuple:
    """swap_ab configs for a problem with few rows: the kernel computes D^T, so its
    tile M (64 ping-pong or 128 cooperative, cluster 1x1) runs along the problem's N
    and its tile N covers the M rows in one tile (M rounded up to 16) or, above 64
    rows, in two. A 64-row tile left M = 154 (the UNet's text-token projections)
    at 154 / 192 of its rows used where a 160-wide one uses 154 / 160, and each
    weight tile is read once rather than once per 64 rows. For M <= SWAP_MAX_M,
    f16 / bf16, K contiguous in A and B, no GLU epilogue, one batch entry; else ()."""
    m, _, _ = gemm_mnk(problem)
    if m > SWAP_MAX_M or problem.batch != 1:
        return ()
    widths = [max(16, -(-m // 16) * 16)]
    if m > 64:
        widths.append(-(-m // 32) * 16)       # two tiles of half the rows each
    configs = (_config((tm, tn, 64), _C11, sched, swap_ab=True)
               for tn in dict.fromkeys(widths) for tm, sched in ((64, PINGPONG), (128, COOP)))
    return tuple(c for c in configs if takes(problem, c) and plausible(problem, c, num_sms))


def _swap_fitted_configs(problem: GemmProblem, num_sms: int) -> tuple:
    """swap_ab configs for problems of more than ``SWAP_MAX_M`` rows: tile M (64
    ping-pong, 128 cooperative; cluster 1x1) along the problem's N, the ``FIT_PER_M``
    tile Ns of ``FIT_TILE_N`` with the smallest ``tile_estimate`` along its M, each only
    when it beats every fixed tile of SPACE by ``FIT_MIN_GAIN``; for K >=
    ``MULTICAST_MIN_K`` the 128-row ones in 2x4 and 2x2 clusters too, where the
    cluster divides the tile grid. cuBLAS ran
    convnext-tiny's 1568x768x3072 on such tiles (nvjet 128x80 in its column-major view,
    2x4 clusters: 6 x 20 = 120 CTAs, 13.5 us on an H100, where our best unswapped tile,
    64x192 ping-pong with 100 CTAs, took 16.2; 128x80 swapped in 2x4 with PDL 13.9;
    benchmarks/results/*_2026-12-07_h100_s52.json)."""
    m, n, k = gemm_mnk(problem)
    if m <= SWAP_MAX_M or problem.batch != 1:
        return ()
    best_fixed = _best_fixed(m, n, num_sms)
    out = []
    for tm, sched in ((64, PINGPONG), (128, COOP)):
        # with a long K the 128-row tiles also in the clusters cuBLAS's kernel used (2 x 4
        # there: 13.9 against 16.0 us in 1x1, session 52) and 2 x 2
        clusters = (_C11,) + (((2, 4, 1), _C22) if tm == 128 and k >= MULTICAST_MIN_K else ())
        for tn in _fitted_ns(n, m, tm, FIT_TILE_N, best_fixed, num_sms):   # the kernel's D^T
            out += [_config((tm, tn, 64), c, sched, swap_ab=True) for c in clusters
                    if not (math.ceil(n / tm) % c[0] or math.ceil(m / tn) % c[1])]
    return tuple(c for c in out if takes(problem, c) and plausible(problem, c, num_sms))


# N-split tiles (KernelConfig.n_split): 192 rows, the two warp groups side by side
# along N (at most 160 fp32 accumulators per thread: tile N <= 192)
N_SPLIT_M = 192
N_SPLIT_TILE_N = (128, 160, 192)


def _n_split_configs(m: int, n: int, num_sms: int) -> tuple:
    """192-row N-split configs (clusters 1x1 and 2x1) for the ``FIT_PER_M`` tile Ns of
    ``N_SPLIT_TILE_N`` with the smallest ``tile_estimate``, each only when it beats
    every fixed tile of SPACE (64 and 128 rows) by ``FIT_MIN_GAIN``: a 192-row tile
    pays where M / 192 fills the waves better (whisper's 6000 x 768: 128 CTAs, one
    wave on 132 SMs; cuBLAS runs it on 192x192 tiles split along N)."""
    if m < 2 * N_SPLIT_M:
        return ()
    return tuple(_config((N_SPLIT_M, tn, 64), c, COOP, n_split=True)
                 for tn in _fitted_ns(m, n, N_SPLIT_M, N_SPLIT_TILE_N, _best_fixed(m, n, num_sms), num_sms)
                 for c in (_C11, _C21))


def launch_variants(config: KernelConfig, problem: GemmProblem, num_sms: int) -> tuple:
    """GemmLaunch knobs worth trying with ``config`` on ``problem`` (no compile
    needed): raster order along M and along N with swizzle 1, 2, 4 and 8 for
    grids of more than one wave, and for stream-K kernels a data-parallel, a
    stream-K and split-K 2 / 3 / 4 decomposition. The default launch comes
    first. PDL is not among them: the tuner tries it once, on the fastest."""
    out = [GemmLaunch()]
    tiles = _ctas(problem, config)
    if tiles > num_sms:
        for raster in ("along_m", "along_n"):
            for swz in (1, 2, 4, 8):
                out.append(GemmLaunch(raster=raster, swizzle=swz))
    return tuple(dict.fromkeys(out + list(decomposition_variants(config, problem))))


def decomposition_variants(config: KernelConfig, problem: GemmProblem) -> tuple:
    """A stream-K kernel's explicit decompositions (data-parallel, stream-K, split-K
    2 / 3 / 4 with at least two K tiles per split); () for other kernels. CUTLASS's
    "heuristic" runs under-one-wave grids with more than half a wave of tiles
    data-parallel (tile_scheduler_params.h get_num_sk_tiles), so a stream-K kernel
    is ranked on these too (tune._rank), not on its default launch alone."""
    if config.tile_scheduler != "stream_k":
        return ()
    out = [GemmLaunch(decomposition="data_parallel"), GemmLaunch(decomposition="stream_k")]
    return tuple(out + [GemmLaunch(decomposition="split_k", splits=s) for s in (2, 3, 4)
                        if problem.k // s >= 2 * config.tile[2]])
