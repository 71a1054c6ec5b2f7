# Source: https://github.com/deepspeedai/DeepSpeed/issues/797
# Confirmed cause: save_checkpoint called for rank 0 only hangs in its barrier; all processes must call it (documented in DeepSpeed PR #801)
# Expected rule(s): rank-gated-collective
class Trainer:
    def _save_checkpoint(self, model, trial, metrics=None):
        output_dir = os.path.join(run_dir, checkpoint_folder)
        if self.is_world_process_zero():
            self.deepspeed.save_checkpoint(output_dir)
