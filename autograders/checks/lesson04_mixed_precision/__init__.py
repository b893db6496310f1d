"""Hidden checks for lesson 4 (mixed precision). Never released; see lesson 1's for the form. One
module per exercise (``train_epoch`` also holds evaluate's cases); this one gathers their cases.

The training loop is observed, not read: a model, optimizer and GradScaler that record what happens
to them (see gpucourse.checks.lesson04_mixed_precision), on a few tiny batches of unequal sizes, so that each case
costs milliseconds.
"""

from gpucourse.checks import Case

from . import clipped_step as clipped, train_epoch as epoch


HIDDEN = {"train_epoch": [
    Case("gradients zeroed between one update and the next backward", epoch.observe_amp_epoch, epoch.judge_zeroing,
         draw=epoch.draw_epoch),
    Case("the scaled loss backpropagated, then scaler.step, then scaler.update, once per batch", epoch.observe_amp_epoch,
         epoch.judge_scaler_order, draw=epoch.draw_epoch),
    Case("the loss: cross-entropy of the output, float32 under autocast", epoch.observe_amp_epoch, epoch.judge_loss, draw=epoch.draw_epoch),
    Case("returns the mean loss of batches of unequal sizes, as a float", epoch.observe_amp_epoch, epoch.judge_mean_loss,
         draw=epoch.draw_epoch),
    Case("train_epoch: batches moved to the model's device inside the loop", epoch.observe_amp_epoch, epoch.judge_moved,
         draw=epoch.draw_epoch),
    Case("train_epoch: autocast with the device type and dtype given (float16 on 'cpu', bfloat16 on 'cuda')",
         epoch.observe_autocast_arguments, epoch.judge_autocast_arguments("train_epoch")),
    Case("evaluate: autocast with the device type and dtype given (float16 on 'cpu', bfloat16 on 'cuda')",
         epoch.observe_autocast_arguments, epoch.judge_autocast_arguments("evaluate")),
    Case("evaluate: the fraction of correct predictions over all items, as a float", epoch.observe_evaluate_items,
         epoch.judge_evaluate_items, draw=epoch.draw_evaluate),
    Case("evaluate: batches moved to the model's device inside the loop", epoch.observe_evaluate_items,
         epoch._judge_moved_in_loop(lambda drawn: 2 * len(drawn["sizes"])), draw=epoch.draw_evaluate),
    Case("returns the mean loss of an epoch of large losses, whose total is beyond float16's range (keep it in float32)",
         epoch.observe_amp_epoch, epoch.judge_mean_loss, draw=epoch.draw_large_losses),
]}


HIDDEN["clipped_step"] = [
    Case("autocast with the device type and dtype given (bfloat16 and float16 on 'cpu', bfloat16 on 'cuda'); "
         "backward outside it", clipped.observe_clipped_autocast, clipped.judge_clipped_autocast),
    Case("generated sizes and max_norm: the reference's norm, parameters and scale, over two steps",
         clipped.observe_clipped_generated, clipped.judge_clipped_generated, draw=clipped.draw_clipped),
    Case("an overflowing step is skipped, returns a non-finite norm and halves the scale, twice",
         clipped.observe_clipped_overflow, clipped.judge_clipped_overflow),
]


_TE = [case.name for case in HIDDEN["train_epoch"]]
_CS = [case.name for case in HIDDEN["clipped_step"]]
_TE_PUBLIC = ["autocast around the forward, scaled backward outside it, loss going down",
              "evaluate under autocast and no_grad, returning accuracy"]
_CS_PUBLIC = ["unscale_ between the scaled backward and scaler.step, then update",
              "the clip sees the true gradient norm and the optimizer gets clipped gradients"]
CLAUSES = {
    "train_epoch": {
        "zero the gradients every batch": [_TE[0]],
        "output and cross-entropy loss under torch.autocast(device_type, dtype=dtype), the device type and dtype given":
            [_TE[2], _TE[5], _TE_PUBLIC[0]],
        "backpropagate scaler.scale(loss) outside autocast": [_TE_PUBLIC[0], _TE[1]],
        "then scaler.step(optimizer) and scaler.update()": [_TE[1]],
        "return the mean (unscaled) loss of the epoch as a float": [_TE[3], _TE[9]],
        "evaluate: the fraction of correct predictions (argmax) over all items, as a float": [_TE[7], _TE_PUBLIC[1]],
        "evaluate: under autocast and without gradients": [_TE_PUBLIC[1], _TE[6]],
        "move each batch to the model's device inside the loops": [_TE[4], _TE[8]],
    },
    "clipped_step": {
        "zero the gradients": [_CS[1]],
        "output and cross-entropy loss under torch.autocast(device_type, dtype=dtype)": [_CS[0], _CS[1]],
        "backpropagate scaler.scale(loss) outside autocast": [_CS[0], _CS_PUBLIC[0]],
        "scaler.unscale_(optimizer), then clip the total norm of all gradients to max_norm": [_CS_PUBLIC[0], _CS_PUBLIC[1], _CS[1]],
        "scaler.step(optimizer) and scaler.update()": [_CS_PUBLIC[0], _CS[2]],
        "return the total norm before clipping, a float; inf or nan on an overflowing step, which is skipped":
            [_CS_PUBLIC[1], _CS[1], _CS[2]],
    },
}
