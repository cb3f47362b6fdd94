"""Agent script: replace the sandbox's init process (pid 1, bwrap's own) by ``PROGRAM ARG...`` (x86-64 Linux).

Usage: ``python hijack_init.py PROGRAM ARG...``. It attaches to pid 1 with ptrace, writes PROGRAM's argv into pid 1's
stack, points its instruction pointer at a ``syscall`` instruction with the registers of ``execve`` and lets it go.
The host-side backend treats that pid as part of the sandbox's wrapper: it is never stopped nor killed with the
agent's processes (timeouts, the evaluation's freeze).
"""

import ctypes
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_ATTACH, PTRACE_DETACH = 12, 13, 16, 17
FIELDS = (
    "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base "
    "ds es fs gs"
).split()


class Registers(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in FIELDS]


def ptrace(request, data=None):
    if libc.ptrace(request, 1, None, data) == -1:
        error = ctypes.get_errno()
        raise SystemExit(f"ptrace({request}) on pid 1 failed: {os.strerror(error)}")


def main(argv):
    ptrace(PTRACE_ATTACH)
    os.waitpid(1, 0x40000000)  # __WALL
    registers = Registers()
    ptrace(PTRACE_GETREGS, ctypes.byref(registers))
    base = (registers.rsp - 65536) & ~0xF  # unused stack below pid 1's own
    strings = [arg.encode() + b"\0" for arg in argv]
    first = base + 8 * (len(strings) + 2)
    pointers, blob = [], b""
    for item in strings:
        pointers.append(first + len(blob))
        blob += item
    table = b"".join(p.to_bytes(8, "little") for p in pointers) + bytes(16)  # argv, NULL, then an empty envp
    with open("/proc/1/mem", "r+b", buffering=0) as memory:
        memory.seek(base)
        memory.write(table + blob)
        memory.seek(registers.rip)
        memory.write(b"\x0f\x05")  # syscall
    registers.rax, registers.orig_rax = 59, 2**64 - 1  # execve; do not restart the call pid 1 was in
    registers.rdi, registers.rsi = pointers[0], base
    registers.rdx = base + 8 * (len(strings) + 1)
    ptrace(PTRACE_SETREGS, ctypes.byref(registers))
    ptrace(PTRACE_DETACH)
    print("pid 1 replaced")


if __name__ == "__main__":
    main(sys.argv[1:])
