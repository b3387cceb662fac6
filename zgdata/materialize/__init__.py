"""One teacher pass over the token set into boundary datasets: resumable commit groups, sharded capture, the virtual first boundary."""
