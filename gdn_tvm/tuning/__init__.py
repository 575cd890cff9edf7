"""MetaSchedule tuning behind `make tune`, and the strict record lookup behind `make build`.

Layout: one folder per workload, `<logs>/<op.workload_key(cfg, kind)>/` (`naming.workload`: the target kind, the
definition and the sizes its PrimFunc reads, e.g. `tuning_logs/llvm/gemv-f32-B1-N2048-K1024/`), holding a pruned
MetaSchedule JSON database (the best record only) and `summary.json` (trials, best and hand-schedule microseconds;
for CUDA the compiler that built what was timed). While a workload is tuned its full database and MetaSchedule's
logs live in `scratch/` beside them; an interrupted run resumes from there.

Matching: a record is found by its workload alone (the structural hash and equality of the specialised
PrimFunc, `Database.get_top_k`), never by the target stored in it. That target JSON differs between machines
(llvm `num-cores`, `mtriple`, the CUDA host's core count) and is informational; the folder's target kind is
checked against it, so a record tuned for another kind is a foreign log.

Modules: `workload` (what is tuned: the specialised function and valid index values), `space` (MetaSchedule's
default rules together with the hand schedules over a knob grid), `measure` (builder and runner functions that
run in worker processes), `records` (paths, validation, pruning, strict lookup), `driver` (the tuning loop).
"""
