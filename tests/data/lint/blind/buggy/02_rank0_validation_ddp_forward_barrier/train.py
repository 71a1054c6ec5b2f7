# pseudo code of the training loop, as posted by the author
for loop:	
	for loop:	
    	...
    	output = model(input)
        ...
        loss.backward
        ...
        torch.distributed.barrier()	
        
	if torch.distributed.get_rank() == 0:
    	...
        validation()
        ...
        torch.save()
        ...
	torch.distributed.barrier()	

# Validation code (rank=0만)
    def validation(self):
        acc1 = 0.0
        acc5 = 0.0
        losses = []
        with torch.no_grad():
            for _, data in enumerate(tqdm(self.val_loader)):
                input = data[0].cuda()
                gt = data[1].cuda()
                outputs = self.encoder(input)
                loss = self.CELoss(outputs, gt)
                losses.append(loss)
                acc1_, acc5_ = self.accuracy(outputs, gt, topk=(1, 5))
                acc1 += acc1_
                acc5 += acc5_
        acc1 = acc1 / len(self.val_loader)
        acc5 = acc5 / len(self.val_loader)
        loss = sum(losses) / len(losses)
        return acc1, acc5, loss
