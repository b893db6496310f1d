"""Hidden checks for lesson 1: LinesDataset (the package's docstring says how every part works)."""

# --- LinesDataset -------------------------------------------------------------------------
# The files are drawn here and written in the sandbox by the observers themselves (plain open()):
# integers from the whole range a torch.tensor holds (0, negative, around 2**31 and 2**53, the int64
# limits), with and without a newline after the last line; the judges know every line.

INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _line_value(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randint(-999, 999)
    if kind == 1:
        return rng.choice([1, -1]) * (2 ** rng.choice([31, 32, 53, 54, 62]) + rng.randint(-3, 3))
    if kind == 2:
        return rng.choice([0, *INT64])
    if kind == 3:
        return rng.randint(*INT64)
    return rng.randint(-10 ** 6, 10 ** 6)


def _file(rng, count, newline_at_end):
    values = [_line_value(rng) for _ in range(count)]
    return {"values": values, "newline_at_end": newline_at_end}


def draw_dataset_items(rng):
    """Two files (a newline after the last line, and none), each with 0, 2**53 + 1 and the int64 limits
    among drawn integers; both datasets made before either is read (two alive at once); the items read in
    a drawn order, some through NumPy indices."""
    files = []
    for newline_at_end in (True, False):
        f = _file(rng, rng.randint(8, 16), newline_at_end)
        for value in (0, 2 ** 53 + 1, -(2 ** 53) - 3, *INT64):
            f["values"][rng.randrange(len(f["values"]))] = value
        order = list(range(len(f["values"])))
        rng.shuffle(order)
        f["order"] = order
        f["numpy"] = sorted(rng.sample(order, 2))
        files.append(f)
    return files


def observe_dataset_items(ns, files):
    import tempfile
    from pathlib import Path

    import numpy
    import torch
    from torch.utils.data import Dataset

    from gpucourse.checks import answer

    folder = Path(tempfile.mkdtemp())
    datasets = []  # every dataset made before any is read: each keeps its own file's lines
    for number, f in enumerate(files):
        path = folder / f"lines{number}.txt"
        path.write_text("\n".join(str(v) for v in f["values"]) + ("\n" if f["newline_at_end"] and f["values"] else ""))
        datasets.append(answer(ns, "LinesDataset")(str(path)))
    result = []
    for f, dataset in zip(files, datasets):
        items = {}
        for i in f["order"]:
            index = numpy.int64(i) if i in f["numpy"] else i
            try:
                item = dataset[index]
                if type(item) is not torch.Tensor:
                    items[str(i)] = f"a {type(item).__module__}.{type(item).__qualname__}"
                elif item.numel() != 1:
                    items[str(i)] = f"a tensor of shape {list(item.shape)}"
                else:
                    items[str(i)] = int(item.reshape(-1)[0])
            except Exception as error:
                items[str(i)] = f"{type(error).__name__}"
        result.append({"len": len(dataset), "is_dataset": isinstance(dataset, Dataset), "items": items})
    return result


def judge_dataset_items(d, files):
    if len(d) != len(files):
        return "not every file was read"
    for f, got in zip(files, d):
        values = f["values"]
        where = "a file without a newline after its last line" if not f["newline_at_end"] else f"a {len(values)}-line file"
        if not got["is_dataset"]:
            return "LinesDataset must be a torch.utils.data.Dataset"
        if got["len"] != len(values):
            return f"len(ds) is not the number of lines for {where}"
        odd = [v for v in got["items"].values() if isinstance(v, str)]
        if odd:
            return f"ds[i] must be a torch.tensor holding line i's integer, got {odd[0]} ({where})"
        wrong = [i for i, want in enumerate(values) if got["items"].get(str(i)) != want]
        if wrong:
            return f"{len(wrong)} of {len(values)} items do not hold exactly the integer on their line ({where})"
    return None


def draw_dataset_bounds(rng):
    """Files of no lines, one line and a drawn number; the indices just outside each end, far outside
    (beyond 2**63), and a NumPy one."""
    files = []
    for count in (0, 1, rng.randint(2, 12)):
        f = _file(rng, count, rng.random() < 0.5)
        n = count
        far = rng.choice([2 ** 63, 2 ** 64 + rng.randint(0, 9), 10 ** 30])
        f["indices"] = sorted({-1, -n, -n - 1, n, n + rng.randint(1, 5), far, -far}, key=lambda i: (i < 0, abs(i)))
        f["numpy"] = [i for i in (n, -1) if i in f["indices"]][:1]
        files.append(f)
    return files


def observe_dataset_bounds(ns, files):
    import tempfile
    from pathlib import Path

    import numpy

    from gpucourse.checks import answer

    folder = Path(tempfile.mkdtemp())
    result = []
    for number, f in enumerate(files):
        path = folder / f"bounds{number}.txt"
        path.write_text("\n".join(str(v) for v in f["values"]) + ("\n" if f["newline_at_end"] and f["values"] else ""))
        dataset = answer(ns, "LinesDataset")(str(path))
        outcomes = []
        for index in f["indices"]:
            try:
                dataset[numpy.int64(index) if index in f["numpy"] else index]
                outcomes.append("no error")
            except IndexError:
                outcomes.append("IndexError")
            except Exception as error:
                outcomes.append(type(error).__name__)
        first = None
        if f["values"]:
            try:
                first = int(dataset[0])
            except Exception as error:
                first = type(error).__name__
        result.append({"len": len(dataset), "first": first, "outcomes": outcomes})
    return result


def judge_dataset_bounds(d, files):
    if len(d) != len(files):
        return "not every file was read"
    for f, got in zip(files, d):
        n = len(f["values"])
        name = {0: "no lines", 1: "one line"}.get(n, f"{n} lines")
        if got["len"] != n or got["first"] != (f["values"][0] if n else None):
            return f"a file of {name}: wrong len(ds) or ds[0]"
        if len(got["outcomes"]) != len(f["indices"]):
            return f"a file of {name}: not every index outside 0 .. len-1 was tried"
        # past the end first: the negative indices are the clause a list's own indexing gets wrong
        for index, outcome in sorted(zip(f["indices"], got["outcomes"]), key=lambda pair: pair[0] < 0):
            if outcome != "IndexError":
                side = "a negative index" if index < 0 else "an index past the end"
                return f"{side} ({index}, file of {name}) must raise IndexError, got {outcome}"
    return None


def draw_dataset_pickle_and_workers(rng):
    """A drawn file, a batch size drawn from 1 to 5."""
    return {**_file(rng, rng.randint(7, 13), True), "batch_size": rng.randint(1, 5)}


def observe_dataset_pickle_and_workers(ns, f):
    import io
    import pickle
    import tempfile
    import types
    from pathlib import Path

    from torch.utils.data import DataLoader

    from gpucourse.checks import answer

    path = Path(tempfile.mkdtemp()) / "loaded.txt"
    path.write_text("\n".join(str(v) for v in f["values"]) + "\n")
    dataset = answer(ns, "LinesDataset")(str(path))
    read_first = [int(dataset[i]) for i in range(len(f["values"]))]  # items read before pickling, as training does
    open_files = []  # the open file objects the dataset holds after that, in its attributes or containers in them
    todo, visited = [(dataset, 0)], set()
    while todo:
        value, depth = todo.pop()
        if id(value) in visited or depth > 3:
            continue
        visited.add(id(value))
        if isinstance(value, io.IOBase):
            if not value.closed:
                open_files.append(type(value).__name__)
            continue
        if isinstance(value, dict):
            todo += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, (list, tuple, set, frozenset)):
            todo += [(v, depth + 1) for v in value]
        elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType)):
            try:
                todo += [(v, depth + 1) for v in vars(value).values()]
            except TypeError:
                pass
    try:
        copy = pickle.loads(pickle.dumps(dataset))
        copied = [int(copy[i]) for i in range(len(f["values"]))]
    except Exception as error:
        copied = f"{type(error).__name__}: {error}"[:200]
    loaded = [int(v) for batch in DataLoader(dataset, batch_size=f["batch_size"], num_workers=2) for v in batch.reshape(-1)]
    return {"read": read_first, "open_files": open_files, "copied": copied, "loaded": loaded}


def judge_dataset_pickle_and_workers(d, f):
    if isinstance(d["copied"], str):
        return f"after reading items, the dataset no longer pickles ({d['copied']})"
    if d.get("open_files"):
        return (f"after reading items the dataset still holds an open file ({d['open_files'][0]}): keep no open file, "
                "open it only while reading")
    if d["copied"] != f["values"]:
        return "the unpickled dataset gives other items than the file holds"
    if d["loaded"] != f["values"]:
        return "DataLoader(num_workers=2) gives other items than the file holds"
    return None
