# Source: https://github.com/kan-bayashi/ParallelWaveGAN/issues/177
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning); maintainer acknowledged and fixed
# Expected rule(s): sampler-no-set-epoch
from torch.utils.data.distributed import DistributedSampler
sampler = {"train": None, "dev": None}
if args.distributed:
    sampler["train"] = DistributedSampler(dataset=dataset["train"], num_replicas=args.world_size, rank=args.rank, shuffle=True)
data_loader = {"train": DataLoader(dataset=dataset["train"], shuffle=False if args.distributed else True,
                                   collate_fn=collater, batch_size=config["batch_size"], sampler=sampler["train"])}

class Trainer:
    def run(self):
        for self.epochs in range(self.config["train_max_epochs"]):
            self._train_epoch()
