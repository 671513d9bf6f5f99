"""What a scenario may ask: the bounds on its steps, lists and whole work."""

MAX_TOP_STEPS = 64
MAX_WRITTEN_STEPS = 500  # step objects in a spec, repeat bodies included
# Steps the planner runs one by one, the rest being counted once repeats cycle: what
# bounds planning's own time (a few milliseconds per thousand).
MAX_PLANNED_STEPS = 2000
MAX_EXECUTED_STEPS = 20_000
MAX_REPEAT_DEPTH = 2
MAX_LIST = 4096
# A spec's whole work, in tensor-steps: each step run counts 1 and each tensor it makes,
# binds or frees counts 1 (a list of 4,096 made 20,000 times would be 82 million). The
# worker does that work; the planner's own cost is linear in the steps it runs, and a
# repeat block stops planning once its iterations repeat (see plan.py).
MAX_TENSOR_STEPS = 300_000
