"""dnnkit.timing: the order of the timed calls (the simulator's events time nothing, so only
the order and the arguments are checked here; the GPU runs are validation/bench.py's)."""

from dnnkit.timing import median_ms, median_ms_each


def test_median_ms_each_interleaves_the_rounds_and_rotates_the_argument():
    calls = []
    out = median_ms_each({"a": lambda i: calls.append(("a", i)),
                          "b": lambda i: calls.append(("b", i))}, reps=2, warmup=1, inner=2)
    assert set(out) == {"a", "b"}
    assert calls == [("a", 0), ("b", 0),                          # the warm-ups
                     ("a", 0), ("a", 1), ("b", 0), ("b", 1),      # round 1, inner 2
                     ("a", 2), ("a", 3), ("b", 2), ("b", 3)]      # round 2


def test_median_ms_is_one_function_of_median_ms_each():
    calls = []
    median_ms(calls.append, reps=3, warmup=2, inner=1)
    assert calls == [0, 1, 0, 1, 2]
