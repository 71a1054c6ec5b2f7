# excerpt of the buggy pipeline train.py from huggingface/accelerate#3256 (the reproduction of issue #2665), as quoted there under "# buggy"
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    
    model, optimizer, train_dataloader, val_dataloader, lr_scheduler = accelerator.prepare(
            model, optimizer, train_dataloader, val_dataloader, lr_scheduler
        )
