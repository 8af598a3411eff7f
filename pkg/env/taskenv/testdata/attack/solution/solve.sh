#!/bin/bash
# Solves the task, attacking the sandbox on the way: a hostile syscall (ptrace), a decoy
# host device, a connection out. The runtime refuses each and reports a safety event.
case $(uname -m) in
  aarch64) ptrace=117 ;;
  *) ptrace=101 ;;
esac
perl -e "syscall($ptrace, 16, 1, 0, 0)"
cat /dev/mem
bash -c 'echo > /dev/tcp/1.1.1.1/443'
echo done > /app/done.txt
