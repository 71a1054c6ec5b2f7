# Source: https://github.com/huggingface/trl/issues/1103
# Confirmed cause: maintainer: gather_object is called within the is_main_process block, so other processes never call it and the main process hangs (fixed in #1177)
# Expected rule(s): rank-gated-collective
from accelerate.utils import gather_object
class PPOTrainer:
    def log_stats(self, stats, batch, rewards):
        if self.accelerator.is_main_process:
            logs = {}
            if "query" not in batch and "response" not in batch:
                warnings.warn("The game logs will not be logged")
            elif self.config.log_with == "wandb":
                batch_list = [batch["query"], batch["response"], rewards.cpu().tolist()]
                table_rows = [list(r) for r in zip(*gather_object(batch_list))]
