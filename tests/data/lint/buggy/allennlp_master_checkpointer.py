# Source: https://github.com/allenai/allennlp/pull/4693
# Confirmed cause: reporter: the checkpointer is called only if master; DeepspeedEngine.save_checkpoint calls dist.barrier() on rank 0 alone, the others never reach it
# Expected rule(s): rank-gated-collective
class GradientDescentTrainer:
    def __init__(self, distributed, local_rank, checkpointer):
        self._rank = local_rank
        self._master = self._rank == 0
        self._checkpointer = checkpointer

    def _try_train(self):
        for epoch in range(self._num_epochs):
            self._train_epoch(epoch)
            if self._master and self._checkpointer is not None:
                self._checkpointer.save_checkpoint(epoch, self, is_best_so_far=True)
