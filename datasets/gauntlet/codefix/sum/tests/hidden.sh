#!/bin/sh
# Hidden cases of the verifier, run from /app; never in the agent's workspace.
echo '@@case 0'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; sum 50 66 ) 2>/dev/null </dev/null
echo '@@case 1'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; sum 25 45 ) 2>/dev/null </dev/null
echo '@@case 2'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; sum 38 60 ) 2>/dev/null </dev/null
echo '@@case 3'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; sum 16 25 ) 2>/dev/null </dev/null
echo '@@case 4'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; sum 14 31 ) 2>/dev/null </dev/null
echo '@@case 5'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; sum 53 81 ) 2>/dev/null </dev/null
