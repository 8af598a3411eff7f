#!/bin/bash
# Usage: backup.sh SRC DEST
src=$1
dest=$2
for f in $(ls $src | grep .txt); do
	cp $src/$f $dest/$f
done
