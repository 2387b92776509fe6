"""The benchmark's statistics over samples."""


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values):
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "n": len(values)}


def merged(samples):
    """One measurement out of several runs of the same mode: lists joined, counts added."""
    out = {}
    for sample in samples:
        for key, value in sample.items():
            if isinstance(value, list):
                out.setdefault(key, []).extend(value)
            elif isinstance(value, dict):
                counts = out.setdefault(key, {})
                for k, v in value.items():
                    counts[k] = counts.get(k, 0) + v
            elif isinstance(value, (int, float)):
                out[key] = out.get(key, 0) + value
    return out
