#!/bin/sh
# Hidden cases of the verifier, run from /app; never in the agent's workspace.
echo '@@case 0'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; repeat la 4 ) 2>/dev/null </dev/null
echo '@@case 1'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; repeat la 2 ) 2>/dev/null </dev/null
echo '@@case 2'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; repeat la 3 ) 2>/dev/null </dev/null
echo '@@case 3'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; repeat ok 2 ) 2>/dev/null </dev/null
echo '@@case 4'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; repeat xy 5 ) 2>/dev/null </dev/null
echo '@@case 5'
( . ./src/lib.sh >/dev/null 2>&1 </dev/null; repeat ok 5 ) 2>/dev/null </dev/null
