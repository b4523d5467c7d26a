"""Runtime: the compiled model and its region modules (one per region kind, each
mapping PyTorch tensors onto the library's C ABI), the library loader, the C++
call path, the region custom op and the Inductor glue around it."""
