package relay

// keyedFloor is where claims walk the outbox's keyed rows from. Below it,
// every keyed row has left the outbox, or belongs to a transaction a
// claim's snapshot showed running: pending keeps, for each of those, where
// its rows may start. Each claim reads the lowest keyed row above the floor,
// and the floor rises to just below it; so the walks pass the rows deleted
// meanwhile, which a held horizon keeps on disk (docs/design.md, "The claim
// floor"). A keyed row a claim skips (its key waits, or an earlier row of
// its key is in flight) stays in the outbox, and holds the floor below it.
type keyedFloor struct {
	floor   int64
	pending pendingTxs
}

func newKeyedFloor() *keyedFloor { return &keyedFloor{pending: map[int64]int64{}} }

// advance places the floor after an ordinary claim from it under snap,
// which saw snap.keyedLow as the lowest keyed row above it (0: none). Every
// id up to visible was taken before snap: with no keyed row above the
// floor, it rises there.
func (k *keyedFloor) advance(snap snapshot, visible int64) {
	to := visible
	if snap.keyedLow > 0 {
		to = snap.keyedLow - 1
	}
	if to > k.floor && k.pending.remember(snap.xip, k.floor) {
		k.floor = to
	}
	// A transaction that ended before snap: its rows below the floor were
	// not in this claim's reach. The next walks from where they may start,
	// once.
	for _, from := range k.pending.ended(snap) {
		k.floor = min(k.floor, from)
	}
}
