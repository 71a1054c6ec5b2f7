# Source: https://github.com/huggingface/transformers/pull/9705
# Confirmed cause: maintainer (stas00): backward needs to be called on the deepspeed object (fixes #9694)
# Expected rule(s): deepspeed-raw-backward
import deepspeed
class Trainer:
    def train(self):
        model, optimizer, _, lr_scheduler = deepspeed.initialize(model=self.model, model_parameters=params, config_params=cfg)
        self.deepspeed = model
        for step, inputs in enumerate(epoch_iterator):
            loss = self.compute_loss(model, inputs)
            loss.backward()
