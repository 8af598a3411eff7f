#!/bin/sh
# Hidden cases of the verifier, run from /app; never in the agent's workspace.
echo '@@case 0'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; clamp 10 16 30 ) 2>/dev/null </dev/null
echo '@@case 1'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; clamp 11 13 40 ) 2>/dev/null </dev/null
echo '@@case 2'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; clamp 18 21 32 ) 2>/dev/null </dev/null
echo '@@case 3'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; clamp 55 20 46 ) 2>/dev/null </dev/null
echo '@@case 4'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; clamp 22 29 53 ) 2>/dev/null </dev/null
echo '@@case 5'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; clamp 25 15 28 ) 2>/dev/null </dev/null
