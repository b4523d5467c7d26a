"""Run as a script by ``integrity`` (never imported by the package): prints the
sha256 of each chunk of an open file it inherits, one hex digest a line.

Arguments: the file descriptor, the size to hash, the chunk size in bytes. The
file is mapped, not read through a buffer (half the memory traffic beside the
parent's work). A file cut short under the mapping kills this process with SIGBUS
and a size past its end fails the mapping: the parent takes either as no answer
and hashes the file itself.
"""
import hashlib
import mmap
import sys


def main() -> None:
    fd, size, step = (int(a) for a in sys.argv[1:4])
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
        view = memoryview(m)
        try:
            out = [hashlib.sha256(view[start:start + step]).hexdigest()
                   for start in range(0, size, step)]
        finally:
            view.release()
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
