F=${DIR:?give DIR, as for prep.py}
# the held-out (4096-token) FP8 gain errors of the shipped and the refitted profiles: the "(before)" row of a fit on those pairs
for P in h200-megakernel-ep1:bench h200-megakernel-power-ep1:bench h200-megakernel-power-ep1-sustained:sustained; do
  n=${P%%:*}; T=${P#*:}
  for q in shipped:$n p2:$F/$n/p2.json; do k=${q%%:*}; f=${q#*:}
    weave-sim calibrate --amend $f --fp8 $F/old_bf16_held.json:$F/old_fp8_held.json $F/new_bf16_held.json:$F/new_fp8_held.json --timing $T --workers 2 -o $F/$n/heldfit_$k.json > $F/$n/heldgain_$k.log 2>&1
    echo "$n $k rc $?"
  done
done
