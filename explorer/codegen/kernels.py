"""Lowering of a plan to a module: the kernels in launch order and the code that launches them.

:func:`lower_plan` (called by the ``scan-lower`` pass with the plan it read from the IR) emits
into the module being compiled: for ``cuda`` a ``gpu.module`` with one ``gpu.func`` per kernel
and a host function that launches them in order (shown in the IR; the runtime launches the PTX
itself with the same geometry); for ``cpu`` one host function ``<kernel>_grid`` per kernel that
runs its blocks one after the other and the threads of a block phase by phase (barriers vanish:
a phase finishes for every thread first), and an entry that calls them like the GPU runtime.
So the host run executes the GPU plan step by step, indices, masks and chunk carries included.

Each level of the plan has its module: :mod:`~explorer.codegen.lower_sequential` (warp tiles),
:mod:`~explorer.codegen.lower_block` (thread composition and the block tree),
:mod:`~explorer.codegen.lower_grid` (chunks across blocks, the lane readout); what they share is
in :mod:`~explorer.codegen.gen` and :mod:`~explorer.codegen.threads`, and the kernel contract
in :mod:`~explorer.codegen.contract`.

Data layout (the kernel ABI): every array is a flat, contiguous buffer (float32; the timed
inputs and outputs of a 16-bit compile are bf16/f16, :mod:`~explorer.codegen.narrow`); inputs are
``(C, L)`` / ``(C, N, L)``, parameters ``(C,)`` / ``(C, N)``, initial states ``(C,)`` / ``(C, N)``,
outputs ``(C, L)`` / ``(C, N, L)``; then ``C``, ``N``, ``L`` as int64; for a vector state, one
int64 row divisor per input with the lane axis (``rowmap``: rows ``(C / div, N, L)``, channel
c reads row ``c // div``) and one int64 row modulus per parameter (``rowmod``: rows ``(mod,
...)`` given for the trailing batch axes alone, channel c reads row ``c % mod``); then the
workspaces and the int64 ``time_chunk`` (tree plans only). A sequence is one ``(channel c,
lane n)`` pair, numbered ``s = c * N + n``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

from mlir.dialects import arith, func, gpu, memref
from mlir.ir import (
    ArrayAttr,
    Attribute,
    Context,
    DictAttr,
    FunctionType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Location,
    MemRefType,
    Module,
    ShapedType,
    Type,
    UnitAttr,
    Value,
)

from explorer.codegen.contract import (
    GRID_SUFFIX,
    KERNEL_PREFIX,
    READOUT_CHUNK_TILES,
    TILE_FLAGS,
    BuiltModule,
    KernelSpec,
    kernel_args,
)
from explorer.codegen.emit import (
    Algebra,
    c32,
    ceil_div,
    ci,
    constants_in,
    f32,
    lt_i,
    mul_i,
    to_index,
)
from explorer.codegen.gen import Gen, Locations, scan_io
from explorer.codegen.lower_grid import (
    blelloch_block,
    lane_loop_block,
    lane_loop_threads_per_sm,
    readout_block,
)
from explorer.codegen.lower_lookback import lookback_block
from explorer.codegen.lower_sequential import seq_layout, sequential_block
from explorer.codegen.narrow import narrow_buffers
from explorer.codegen.options import (
    SHARED_LIMIT,
    STATIC_SHARED_LIMIT,
    Options,
    options_for,
    tile_of,
)
from explorer.codegen.residency import lookback_threads_per_sm
from explorer.codegen.shared_layout import (
    carve,
    lane_loop_split,
    shared_arrays,
    shared_bytes,
    stage_counts,
    tile_steps,
)
from explorer.codegen.threads import Threads, flat_memref, for_loop, if_then
from explorer.errors import CompileError, OptionError
from explorer.frontend.names import SEGMENT_MARKS, TIME_CHUNK

INT_ROLES = ("size", "rowmap", "rowmod")   #: the int64 arguments (the rest are buffers)


def _array_sizes(args: list[dict[str, Any]], C: Value, N: Value, L: Value,
                 Tc: Value | None, row_div: dict[str, Value], row_mod: dict[str, Value],
                 segments: bool = False) -> dict[str, Value]:
    sizes = {}
    CN = mul_i(C, N)
    for a in args:
        if a["role"] in INT_ROLES:
            continue
        if a["role"] == "segments":   # one mark per time step, shared by the channels
            sizes[a["name"]] = L
            continue
        if a["role"] == "workspace":
            per_call = a["time_chunk"] == TIME_CHUNK
            assert Tc is not None or not per_call
            chunks = ceil_div(L, Tc if per_call and Tc is not None else ci(a["time_chunk"]))
            sizes[a["name"]] = mul_i(mul_i(CN, chunks), ci(a["per_chunk"]))
            continue
        rows = C   # channels: a row each, a row per block of them, a row per trailing one
        if a["role"] in ("input", "output") and a["name"] in row_div:
            rows = arith.divui(C, row_div[a["name"]])
        if a["role"] == "param" and a["name"] in row_mod:
            rows = row_mod[a["name"]]
        rows = mul_i(rows, N) if a["lane"] else rows
        if segments and a["role"] in ("h0", "output") and not a["timed"]:
            # a state per packed sequence: at most L (it only shapes the memref, unchecked)
            rows = mul_i(rows, L)
        sizes[a["name"]] = mul_i(rows, L) if a["timed"] else rows
    return sizes


def _plan_of(form: Any, options: Options, plan: Any) -> tuple[Options, Any]:
    """The options, their open tile resolved for ``form``; ``plan`` or scan-plan's choice."""
    from explorer.passes.plan import choose_plan
    from explorer.passes.plan_options import resolve_tiles

    options = resolve_tiles(options, form.recurrence)
    return options, plan if plan is not None else choose_plan(form, options)


def kernel_specs(form: Any, options: Options, plan: Any = None) -> list[KernelSpec]:
    """The kernels of a compile, in launch order, with their geometry (of ``plan``, by
    default the one ``scan-plan`` would choose)."""
    options, plan = _plan_of(form, options, plan)
    bs = int(options.block_size)
    block = (bs, 1, 1)
    alg = Algebra(form.A)
    out: list[KernelSpec] = []
    lane_sum = plan.lane_sum
    if options.strategy == "sequential":
        lay = seq_layout(form, options, plan.stored, lane_sum)
        shared = lay.floats * 4 if options.target == "cuda" else 0
        out.append(KernelSpec(f"{KERNEL_PREFIX}_sequential", "scan", block, bs, shared,
                              channels="threads" if lane_sum is not None else None))
    else:
        gen_counts = stage_counts(form, options, plan)
        # whole sequences: the scan kernel alone; cut into tiles: the look-back kernel alone,
        # or the chunked scan's reduce, carry and scan kernels
        lookback = plan.grid.scheme == "lookback"
        roles = ((("scan", ""), ("lookback", "_lookback")) if lookback else
                 (("reduce", "_reduce"), ("carry", "_carry"), ("scan", "")))
        # sequences up to the short kernel's longest run there, the rest in the others
        longest = plan.short.longest if plan.short is not None else None
        if plan.short is not None:
            roles = (("short", "_short"), *roles)
        for role, suffix in roles:
            opts, layout_role = tile_of(options, plan, role)
            arrays = shared_arrays(form, opts, layout_role, plan)
            static = sum(arrays) * 4
            if options.target == "cuda" and shared_bytes(arrays) > SHARED_LIMIT:
                raise OptionError(
                    f"a Blelloch tile of {tile_steps(opts, plan, layout_role)} elements "
                    f"({gen_counts[layout_role]} staged arrays, elements of {alg.width} floats) "
                    f"needs {static} bytes of shared memory, more than {SHARED_LIMIT}: lower "
                    + ("lookback_threads * lookback_elements" if role == "lookback"
                       else "block_size * elements_per_thread"))
            # past CUDA's 48 KiB of static shared memory the arrays are carved out of the
            # block's dynamic shared memory, which the launch opts in to
            dynamic = (shared_bytes(arrays) if options.target == "cuda"
                       and static > STATIC_SHARED_LIMIT else 0)
            whole_only = role == "scan" and lookback
            lane_loop = role == "scan" and lane_sum is not None and lane_sum.fused
            threads = (plan.lookback.threads if role == "lookback" else
                       int(opts.block_size))
            out.append(KernelSpec(
                f"{KERNEL_PREFIX}_{options.strategy}{suffix}", role, (threads, 1, 1), 1, dynamic,
                0 if dynamic else static,
                time_chunk=None if role == "carry" else TIME_CHUNK,
                launch_when_longer_than=(longest if role == "scan" else None if role == "short"
                                         else TIME_CHUNK),
                launch_unless_longer_than=(longest if role == "short" else
                                           TIME_CHUNK if whole_only else None),
                min_blocks_per_sm=(max(1, lookback_threads_per_sm(
                                       int(options.lookback_elements), opts.tile_layout,
                                       options.dtype) // threads) if role == "lookback"
                                   else max(1, lane_loop_threads_per_sm(
                                       int(options.elements_per_thread)) // bs) if lane_loop
                                   else 0),
                channels="block" if lane_loop else None,
                zeroes=(TILE_FLAGS,) if role == "lookback" else ()))
    if lane_sum is not None and not lane_sum.fused:
        out.append(KernelSpec(f"{KERNEL_PREFIX}_readout", "readout", block, 1,
                              time_chunk=READOUT_CHUNK_TILES * bs))
    return out


def lower_plan(module_op: Any, form: Any, options: Options, plan: Any,
               locations: Any = None) -> BuiltModule:
    """Emit the kernels of ``plan`` (read from the ``scan`` ops) at the end of ``module_op``,
    in the current context: the ``gpu`` module and its launcher, or the host functions."""
    import time

    start = time.perf_counter()
    opts = options_for(options, plan)
    _check_outputs(form, plan)
    if plan.tree == "none" and plan.tile_steps != seq_layout(form, opts, plan.stored,
                                                             plan.lane_sum).steps:
        raise CompileError(f"the plan's warp tile of {plan.tile_steps} steps is not one this "
                           "lowering can stage in shared memory")
    args = kernel_args(form, opts, plan=plan)
    kernels = kernel_specs(form, opts, plan)
    locs = locations or Locations()
    # every op defaults to the location of the (first) state's statement
    with locs.statements.get(form.recurrence.states[0]) or nullcontext():
        if opts.target == "cuda":
            _cuda_module(module_op, form, opts, args, kernels, plan, locs)
        else:
            _cpu_module(module_op, form, opts, args, kernels, plan, locs)
        # the arrays the contract makes 16-bit: bf16/f16 buffers, extf loads, truncf stores
        narrow_buffers(module_op, args)
    main = next(k for k in kernels if k.role == "scan")
    return BuiltModule(text="", kernel_name=main.name, args=args, block=main.block,
                       sequences_per_block=main.sequences_per_block,
                       shared_bytes=main.shared_bytes, target=opts.target,
                       kernels=kernels, static_shared_bytes=main.static_shared_bytes,
                       seconds=time.perf_counter() - start)


def _check_outputs(form: Any, plan: Any) -> None:
    """The plan's stored outputs and lane sum fit the recurrence being lowered."""
    from explorer.frontend.names import last_name
    from explorer.passes.outputs import last_states
    from explorer.passes.plan import lane_sum_of

    rec = form.recurrence
    lasts = {last_name(s) for s in last_states(rec, plan.stored)}
    unknown = [o for o in plan.stored if o not in form.outputs and o not in lasts]
    if unknown:
        raise CompileError(f"the plan stores {unknown}, which the recurrence does not have "
                           f"(its outputs: {list(form.outputs)})")
    want = lane_sum_of(form, plan.stored, plan.strategy, plan.grid.scheme)
    if plan.lane_sum != want:
        raise CompileError(f"the plan's lane sum {plan.lane_sum} is not the one the lowering "
                           f"implements for {list(plan.stored)} of {rec.text!r}: {want}")


def build_module(form: Any, options: Options, plan: Any = None) -> BuiltModule:
    """The kernels of ``form`` for ``options`` (and the plan ``scan-plan`` would choose) as a
    module of their own, as text: the lowering without the passes before it."""
    with Context(), Location.unknown():
        module = Module.create()
        built = lower_plan(module.operation, form, *_plan_of(form, options, plan))
        if not module.operation.verify():
            raise CompileError("the generated module does not verify", ir_before=str(module))
        built.text = str(module)
    return built


def _i64() -> IntegerType:
    return IntegerType.get_signless(64)


def _bind(form: Any, options: Options, args: list[dict[str, Any]], values: list[Value],
          as_flat: Callable[[Value, Value], Value], plan: Any, locs: Locations,
          role: str = "scan") -> Gen:
    # sizes by role: an input may itself be called C (Mamba's readout matrix)
    size = {a["name"]: v for a, v in zip(args, values, strict=False) if a["role"] == "size"}
    row_div, row_mod = ({a["name"]: to_index(v) for a, v in zip(args, values, strict=False)
                         if a["role"] == role} for role in ("rowmap", "rowmod"))
    by_name = {a["name"]: v for a, v in zip(args, values, strict=False)
               if a["role"] not in INT_ROLES}
    C, N, L = (to_index(size[k]) for k in ("C", "N", "L"))
    Tc = to_index(size[TIME_CHUNK]) if TIME_CHUNK in size else None
    sizes = _array_sizes(args, C, N, L, Tc, row_div, row_mod, plan.segments)
    arrays = {name: as_flat(by_name[name], n) for name, n in sizes.items()}
    gen = Gen(form, options, arrays, C, N, L, scan_io(form, plan.stored, plan.lane_sum))
    gen.row_div = row_div
    gen.row_mod = row_mod
    gen.marks = arrays[SEGMENT_MARKS] if plan.segments else None
    gen.Tc = Tc
    gen.sweeps = (plan.short.sweeps(plan.tree, plan.shuffled) if role == "short" else
                  plan.sweeps)
    gen.reverse = options.reverse
    gen.locs = dict(locs.names)
    gen.statement_locs = dict(locs.statements)
    return gen


def _kernel_body(gen: Gen, spec: KernelSpec, th: Threads, bid: Value,
                 shared: Sequence[Value], hs: Value | None, plan: Any) -> None:
    if spec.role == "readout":
        readout_block(gen, th, bid)
    elif gen.options.strategy == "sequential":
        lay = seq_layout(gen.form, gen.options, plan.stored, plan.lane_sum)
        sequential_block(gen, th, lay, bid, shared[0], hs)
    else:
        width = gen.alg.width
        _, role = tile_of(gen.options, plan, spec.role)    # the short kernel is a scan kernel
        count = stage_counts(gen.form, gen.options, plan)[role]
        stage, aggbuf = shared[:count], shared[count:count + width]
        if spec.role == "lookback":
            gen.sweeps = plan.lookback.sweeps(plan.tree)   # its block's own tree
            lookback_block(gen, th, bid, stage, aggbuf)
        elif spec.channels == "block":
            split = lane_loop_split(gen.form, plan)
            assert split is not None
            rest = shared[count + width:]
            lane_loop_block(gen, th, bid, stage, aggbuf, rest[:len(split.channel_staged)],
                            rest[len(split.channel_staged):], split)
        else:
            blelloch_block(gen, th, role, bid, stage, aggbuf)


def _cuda_module(module_op: Any, form: Any, options: Options, args: list[dict[str, Any]],
                 kernels: list[KernelSpec], plan: Any, locs: Locations) -> None:
    module_op.attributes["gpu.container_module"] = UnitAttr.get()
    # bare-pointer ABI: a buffer arrives as a 0-d memref (one pointer) and is reshaped to the
    # flat memref<?xf32> of its size inside the kernel
    ptr = MemRefType.get([], f32())
    arg_types: list[Type] = [ptr if a["role"] not in INT_ROLES else _i64() for a in args]
    ftype = FunctionType.get(arg_types, [])
    workgroup = Attribute.parse("#gpu.address_space<workgroup>")
    with InsertionPoint(module_op.regions[0].blocks[0]):
        gmod = gpu.GPUModuleOp(f"{KERNEL_PREFIX}_kernels")
        gmod.bodyRegion.blocks.append()
        with InsertionPoint(gmod.bodyRegion.blocks[0]):
            for spec in kernels:
                fn = gpu.GPUFuncOp(ftype, sym_name=spec.name, kernel=True,
                                   known_block_size=list(spec.block))
                if spec.min_blocks_per_sm:
                    # ask ptxas for registers that leave room for this many blocks per SM
                    fn.attributes["nvvm.minctasm"] = IntegerAttr.get(
                        IntegerType.get_signless(32), spec.min_blocks_per_sm)
                opts, role = tile_of(options, plan, spec.role)
                static = [] if spec.shared_bytes else shared_arrays(form, opts, role, plan)
                wg_types: list[Type] = [MemRefType.get([n], f32(), memory_space=workgroup)
                                        for n in static]
                if wg_types:
                    fn.attributes["workgroup_attributions"] = IntegerAttr.get(
                        _i64(), len(wg_types))
                    # 16-byte aligned: LLVM merges neighbouring shared loads into vector
                    # loads (ld.shared.v2), which fault on a 4-byte aligned buffer
                    fn.attributes["workgroup_attrib_attrs"] = ArrayAttr.get([
                        DictAttr.get({"llvm.align": IntegerAttr.get(_i64(), 16)})
                        for _ in wg_types])
                block = fn.body.blocks.append(*arg_types, *wg_types)
                with InsertionPoint(block), constants_in(block):
                    values = list(block.arguments)

                    def as_flat(v: Value, size: Value) -> Value:
                        dyn = ShapedType.get_dynamic_size()
                        return memref.reinterpret_cast(flat_memref(), v, [], [size], [], [0],
                                                       [dyn], [1])
                    gen = _bind(form, opts, args, values[:len(args)], as_flat, plan, locs,
                                spec.role)
                    shared = values[len(args):]
                    if spec.shared_bytes:
                        raw = gpu.dynamic_shared_memory(MemRefType.get(
                            [ShapedType.get_dynamic_size()], IntegerType.get_signless(8),
                            memory_space=workgroup))
                        view = MemRefType.get([ShapedType.get_dynamic_size()], f32(),
                                              memory_space=workgroup)
                        shared = [memref.view(view, raw, ci(offset), [ci(n)]) for offset, n
                                  in carve(shared_arrays(form, opts, role, plan))]
                    th = Threads(True, spec.block[0], gpu.thread_id(gpu.Dimension.x))
                    _kernel_body(gen, spec, th, gpu.block_id(gpu.Dimension.x), shared, None,
                                 plan)
                    gpu.return_([])
        _cuda_host_launcher(args, arg_types, kernels)


def _size_value(v: int | str, sizes: dict[str, Value]) -> Value:
    return sizes[v] if isinstance(v, str) else ci(v)


def _sizes_of(args: list[dict[str, Any]], vals: Sequence[Value]) -> dict[str, Value]:
    """Index values of the size arguments (C, N, L and time_chunk when there)."""
    return {a["name"]: to_index(v) for a, v in zip(args, vals, strict=True)
            if a["role"] == "size"}


def _grid_value(spec: KernelSpec, sizes: dict[str, Value]) -> Value:
    if spec.channels == "block":
        blocks = sizes["C"]
    elif spec.channels == "threads":   # floor(threads / N) whole channels a block
        blocks = ceil_div(sizes["C"], arith.divui(ci(spec.block[0]), sizes["N"]))
    else:
        blocks = ceil_div(mul_i(sizes["C"], sizes["N"]), ci(spec.sequences_per_block))
    if spec.time_chunk is not None:
        blocks = mul_i(blocks, ceil_div(sizes["L"], _size_value(spec.time_chunk, sizes)))
    return blocks


def _launch_if(spec: KernelSpec, sizes: dict[str, Value], launch: Callable[[], None]) -> None:
    ok = arith.constant(IntegerType.get_signless(1), 1)
    if spec.launch_when_longer_than is not None:
        ok = lt_i(_size_value(spec.launch_when_longer_than, sizes), sizes["L"])
    if spec.launch_unless_longer_than is not None:
        at_most = _size_value(spec.launch_unless_longer_than, sizes)
        ok = arith.andi(ok, arith.cmpi(arith.CmpIPredicate.sle, sizes["L"], at_most))
    if_then(ok, launch)


def _cuda_host_launcher(args: list[dict[str, Any]], arg_types: list[Type],
                        kernels: list[KernelSpec]) -> None:
    """A host function that launches the kernels in order (shown in the IR; the runtime
    launches the PTX itself with the same geometry)."""
    fn = func.FuncOp(f"{KERNEL_PREFIX}_launch", FunctionType.get(arg_types, []))
    block = fn.add_entry_block()
    with InsertionPoint(block), constants_in(block):
        vals = list(block.arguments)
        sizes = _sizes_of(args, vals)
        one = ci(1)
        for spec in kernels:
            def launch(spec: KernelSpec = spec) -> None:
                grid = _grid_value(spec, sizes)
                dyn = (c32(spec.shared_bytes)
                       if spec.shared_bytes else None)
                gpu.launch_func([f"{KERNEL_PREFIX}_kernels", spec.name], (grid, one, one),
                                (ci(spec.block[0]), one, one), kernel_operands=vals,
                                dynamic_shared_memory_size=dyn)
            _launch_if(spec, sizes, launch)
        func.return_([])


def _cpu_module(module_op: Any, form: Any, options: Options, args: list[dict[str, Any]],
                kernels: list[KernelSpec], plan: Any, locs: Locations) -> None:
    """Host code: one ``<kernel>_grid(args..., grid)`` per kernel that runs its blocks one
    after the other and the threads of a block phase by phase, and the entry
    ``scanweaver_<strategy>(args...)`` that launches them in order like the GPU runtime."""
    arg_types: list[Type] = [flat_memref() if a["role"] not in INT_ROLES else _i64()
                             for a in args]
    bs = int(options.block_size)
    with InsertionPoint(module_op.regions[0].blocks[0]):
        grid_fns = {}
        for spec in kernels:
            fn = func.FuncOp(spec.name + GRID_SUFFIX,
                             FunctionType.get([*arg_types, _i64()], []))
            fn.attributes["llvm.emit_c_interface"] = UnitAttr.get()
            grid_fns[spec.name] = fn
            block = fn.add_entry_block()
            with InsertionPoint(block), constants_in(block):
                values = list(block.arguments)
                opts, role = tile_of(options, plan, spec.role)
                gen = _bind(form, opts, args, values[:len(args)], lambda v, size: v, plan, locs,
                            spec.role)
                shared = [memref.alloc(MemRefType.get([n], f32()), [], [])
                          for n in shared_arrays(form, opts, role, plan)]
                hs = None
                if options.strategy == "sequential" and spec.role == "scan":
                    hs = memref.alloc(MemRefType.get([bs * gen.alg.S], f32()), [], [])
                th = Threads(False, spec.block[0])

                def one_block(b: Value, _: list[Value], gen: Gen = gen, spec: KernelSpec = spec,
                              shared: list[Value] = shared, hs: Value | None = hs,
                              th: Threads = th) -> list[Value]:
                    _kernel_body(gen, spec, th, b, shared, hs, plan)
                    return []
                for_loop(ci(0), to_index(values[-1]), ci(1), one_block)
                for buf in [*shared, *([hs] if hs is not None else [])]:
                    memref.dealloc(buf)
                func.return_([])
        entry = func.FuncOp(f"{KERNEL_PREFIX}_{options.strategy}",
                            FunctionType.get(arg_types, []))
        entry.attributes["llvm.emit_c_interface"] = UnitAttr.get()
        block = entry.add_entry_block()
        with InsertionPoint(block), constants_in(block):
            vals = list(block.arguments)
            sizes = _sizes_of(args, vals)
            for spec in kernels:
                def launch(spec: KernelSpec = spec) -> None:
                    grid = arith.index_cast(_i64(), _grid_value(spec, sizes))
                    func.call([], spec.name + GRID_SUFFIX, [*vals, grid])
                _launch_if(spec, sizes, launch)
            func.return_([])
