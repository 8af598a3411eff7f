#!/bin/sh
# Hidden cases of the verifier, run from /app; never in the agent's workspace.
echo '@@case 0'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; max 58 89 ) 2>/dev/null </dev/null
echo '@@case 1'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; max 84 109 ) 2>/dev/null </dev/null
echo '@@case 2'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; max 3 51 ) 2>/dev/null </dev/null
echo '@@case 3'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; max 38 54 ) 2>/dev/null </dev/null
echo '@@case 4'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; max 41 73 ) 2>/dev/null </dev/null
echo '@@case 5'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; max 65 90 ) 2>/dev/null </dev/null
