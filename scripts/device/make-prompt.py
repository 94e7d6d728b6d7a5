"""Write a prompt of plain English words for `pipeshard run -f` (synthetic
models tokenize it to about 4,090 tokens with 2,075 words)."""
import random
import sys

WORDS = """the of and to in is was for on that with as by at from his her an which
are this be or had it not but have were they their one all has been its also who
more after first new two when other there into time can only most some over such
three about between than during may later many where these then both under would
while made part through city before known well used years since being until
state people world school family year however called war united american
series""".split()

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2075
random.seed(1)
print(" ".join(random.choice(WORDS) for _ in range(n)))
