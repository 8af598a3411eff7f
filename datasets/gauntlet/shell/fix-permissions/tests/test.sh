#!/bin/bash
mkdir -p /logs/verifier
reward=0
mode() { stat -c %a "$1" 2>/dev/null; }
if [ "$(mode /app/bin/start.sh)" != 755 ] || [ "$(mode /app/bin/stop.sh)" != 755 ]; then
	echo "the scripts are not 755"
elif [ "$(mode /app/secrets/key.pem)" != 600 ]; then
	echo "key.pem is not 600"
elif [ "$(mode /app/bin/README)" != 644 ]; then
	echo "README's mode was changed"
elif [ "$(head -1 /app/bin/start.sh)" != "#!/bin/sh" ] || ! grep -q 'not a real key' /app/secrets/key.pem; then
	echo "contents were changed"
else
	reward=1
fi

echo "$reward" > /logs/verifier/reward.txt
