#!/bin/sh
# Hidden cases of the verifier, run from /app; never in the agent's workspace.
echo '@@case 0'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; parity 808 ) 2>/dev/null </dev/null
echo '@@case 1'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; parity 793 ) 2>/dev/null </dev/null
echo '@@case 2'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; parity 522 ) 2>/dev/null </dev/null
echo '@@case 3'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; parity 720 ) 2>/dev/null </dev/null
echo '@@case 4'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; parity 345 ) 2>/dev/null </dev/null
echo '@@case 5'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; parity 796 ) 2>/dev/null </dev/null
