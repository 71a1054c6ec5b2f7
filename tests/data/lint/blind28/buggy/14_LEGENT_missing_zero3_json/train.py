from legent.model.llava.train import train_mem

if __name__ == "__main__":
    train_mem.train()
