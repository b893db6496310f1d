"""Hidden checks for the assessment quiz: the right letters, and a hint for a wrong one.

What each question states, and the case that tests it:
 1. its answer is a str                                          -> "qN is one of a-d" (public), "qN: the answer"
 2. one of the letters a-d; case, and spaces, brackets or quotes
    around it, do not matter (the notebook's intro)              -> "qN is one of a-d" (public), "qN: the answer"
 3. the right letter                                             -> "qN: the answer"
"""

from gpucourse.checks import Case
from gpucourse.checks.quiz import QUESTIONS, judge_form, observe_answer


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


def _judge(question):
    right, hint = KEY[question]
    form = judge_form(question)

    def judge(d):
        return form(d) or (None if d.get(question) == right else f"not this one. Hint: {hint}")
    return judge


HIDDEN = {q: [Case(f"{q}: the answer", observe_answer, _judge(q))] for q in QUESTIONS}
