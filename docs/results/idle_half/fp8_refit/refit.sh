#!/bin/bash
# The FP8 tile factor (--amend P --fp8, pairs at 2048 / 8192 tokens), then the FP8 half-tile cost on top (--half-tiles),
# then the held-out 4096-token FP8 results with the shipped and the refitted profile. $1 profile, $2 timing (bench|sustained)
P=$1; T=$2; F=${DIR:?give DIR, as for prep.py}; D=$F/$P; mkdir -p $D
s=$SECONDS
weave-sim calibrate --amend $P --fp8 $F/old_bf16_fit.json:$F/old_fp8_fit.json $F/new_bf16_fit.json:$F/new_fp8_fit.json --timing $T --workers 2 -o $D/p1.json > $D/amend_fp8.log 2>&1
echo "amend fp8 rc $? $((SECONDS-s))s"
weave-sim calibrate --amend $D/p1.json --half-tiles $F/fp8_fit.json --timing $T --workers 2 -o $D/p2.json > $D/amend_half.log 2>&1
echo "amend half rc $? $((SECONDS-s))s"
for q in shipped:$P p2:$D/p2.json; do n=${q%%:*}; f=${q#*:}
  weave-sim validate $F/fp8_held.json --timing $T --profile $f --workers 2 --out $D/val_$n > $D/val_$n.log 2>&1
  echo "validate $n rc $? $((SECONDS-s))s"
done
