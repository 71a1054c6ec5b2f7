# Copyright 2023 The DLRover Authors. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
# http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# [... lines 14-204 of model_zoo/pytorch/nanogpt/train.py @ 4390815e omitted ...]
    # Auto implement a GradScaler
    ptdtype = {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[dtype]
    ctx = (
        contextlib.nullcontext()
        if device_type == "cpu"
        else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
    )
    model = gpt_init(meta_vocab_size, args=args)
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    model = model.to(device)
    # Optimizer
    print(f"creating optimizer...{model.parameters()}")
    optimizer = model.configure_optimizers(
        weight_decay=args.weight_decay,
        learning_rate=args.learning_rate,
        betas=(args.beta1, args.beta2),
        device_type=device_type,
    )

    if torch.cuda.is_available() and device_type == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        # Create model and move it to GPU with id rank
        model = model.to(local_rank)
        if use_fsdp:
            print(f"Running basic FSDP example on local rank {local_rank}.")
            model = FSDP(model, device_id=local_rank)
        else:
            print(f"Running basic DDP example on local rank {local_rank}.")
            model = DDP(model, device_ids=[local_rank])
            print(f"Model device {model.device}")

    else:
        local_rank = int(os.environ["LOCAL_RANK"])
        print(f"Running basic CPU example on device {device}.")
        model = model.to(device)
        model = DDP(model)
        print(f"Model device {model.device}")

    # Compile the model
    if compile == "True":
        print("compiling the model... (takes a ~minute)")
        model = torch.compile(model)  # requires PyTorch 2.0
