"""Hidden checks for the assessment quiz: the right letters, and a hint for a wrong one.

What each question states, and the case that tests it:
 1. its answer is a str                                          -> "qN is one of a-d" (public), "qN: the answer"
 2. one letter a-d; upper or lower case, and spaces, brackets or
    quotes around the letter, do not matter (the notebook's intro:
    "C" and "(c)" are c too; any Unicode space, bracket or quotation
    mark: "\\r", "<c>", a curly quote); nothing else: no other character
    beside it (a full stop, a colon, asterisks, backticks)         -> "qN: the answer" (the public check reads
                                                                       the form the same way)
 3. the right letter                                             -> "qN: the answer"

The hidden observer reports each answer exactly as written (a str subclass read as the plain text it
holds); the judge here reads it by the intro's rule alone.
"""

from gpucourse.checks import Case
from gpucourse.checks.quiz_gpu_data_parallel import QUESTIONS, letter_of  # the intro's rule, read alike on both sides


KEY = {
    "q1": ("c", "what happens to *this* coroutine, and to the event loop, at an await?"),
    "q2": ("d", "does time.sleep ever give control back to the event loop?"),
    "q3": ("a", "XRT and XRT_TPU_CONFIG were removed from PyTorch/XLA."),
    "q4": ("c", "XLA compiles a graph for each new set of shapes (on a GPU, so do torch.compile without "
               "dynamic shapes, CUDA graphs and cudnn.benchmark: each pays again per new shape)."),
    "q5": ("d", "tpu_cores= and gpus= were removed in Lightning 2.0."),
    "q6": ("b", "compare x.shape and x.stride() before and after."),
    "q7": ("c", "in NHWC the channel index changes fastest."),
    "q8": ("a", "which function returns a number of devices?"),
    "q9": ("d", "memory of tensors that are still alive is never freed by it."),
    "q10": ("b", "nvidia-smi also counts the CUDA context and the allocator's cache."),
    "q11": ("a", "clip_grad_norm_ compares the gradients with max_norm: in which units are they after a scaled backward?"),
    "q12": ("b", "compare how many exponent bits float16, bfloat16 and float32 have, and what the scaler protects against."),
    "q13": ("c", "what kind of host memory can the GPU copy from without the CPU staging it, and what does "
                 "non_blocking let the host do meanwhile?"),
    "q14": ("d", "DDP keeps the replicas identical from step to step, and does not change the learning rate."),
    "q15": ("a", "count every factor: processes per node, nodes, the batch of each process, and the accumulated batches."),
    "q16": ("b", "SLURM's --ntasks-per-node and --gres are per node, and Lightning wants one task per GPU."),
    "q17": ("a", "which dtype do the parameters keep under autocast, and which dtype does a parameter's gradient have?"),
    "q18": ("b", "checkpoint_sequential checkpoints segments - 1 segments and runs the last one normally."),
    "q19": ("c", "ZeRO-1 shards only the optimizer state; parameters and gradients stay whole on every rank."),
    "q20": ("d", "the bubble is the p - 1 slots of fill and drain out of m + p - 1."),
    "q21": ("b", "algbw = S / t; for an all-reduce nccl-tests multiplies it by 2(n - 1)/n."),
    "q22": ("d", "three ring phases per step (all-gather for forward, all-gather for backward, reduce-scatter of "
                 "gradients), each sending (N - 1)/N of the 2 GB buffer."),
    "q23": ("a", "each element of the 8192 × 8192 matrix is read once and used for one multiply-add: count FLOPs per byte."),
    "q24": ("c", "which cost does not grow with the batch size?"),
    "q25": ("d", "a DCP checkpoint is complete only once its .metadata is written, and loading reshards to any world size."),
    "q26": ("a", "torchrun restarts the whole worker group, and nothing survives but what is on disk."),
}


def observe_written(ns):
    # every answer qN as written: its plain text (str's own methods: a subclass's overrides are not used),
    # or what is wrong with it (not a str)
    from gpucourse.checks import answer_problem

    found = {}
    for name in (f"q{n}" for n in range(1, 27)):
        if name in ns:
            problem = answer_problem(ns, name)
            found[name] = {"problem": problem} if problem else {"text": str.__str__(ns[name])}
    return found


def _judge(question):
    right, hint = KEY[question]

    def judge(d):
        found = d.get(question) if isinstance(d, dict) else None
        if found is None:
            return f"not answered yet: define `{question}` (a str, one of the letters \"a\", \"b\", \"c\", \"d\")"
        if "problem" in found:
            return found["problem"]
        text = found.get("text")
        letter = letter_of(text) if isinstance(text, str) else None
        if letter is None:
            return (f"{question} = {text!r} is not one letter: write one of 'a', 'b', 'c', 'd' (either case), with "
                    "nothing around it but spaces, brackets or quotes")
        return None if letter == right else f"not this one. Hint: {hint}"
    return judge


HIDDEN = {q: [Case(f"{q}: the answer", observe_written, _judge(q))] for q in QUESTIONS}
