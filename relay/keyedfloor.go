package relay

// keyedFloor is where claims walk the outbox's keyed rows from, so that the
// walks pass the rows deleted meanwhile (docs/design.md, "The claim floor").
// claimFloor's methods read and write it, under claimFloor.mu.
type keyedFloor struct {
	// Every keyed row below floor has left the outbox or belongs to a
	// transaction in pending; advance raises it to just below the lowest
	// keyed row a claim saw above it.
	floor int64
	// Every keyed row in the owed table not yet delivered to an enabled
	// target, parked or not, lies above owed: it is floor, or just below
	// the lowest such row a claim saw above it. Rows move there only from
	// the outbox, from above floor.
	owed int64
	// pending maps each transaction running when floor rose to where its
	// rows may start; a claim that sees it ended sends floor back there.
	pending pendingTxs
}

func newKeyedFloor() *keyedFloor { return &keyedFloor{pending: map[int64]int64{}} }

// advance places the floor after an ordinary claim from it under snap,
// which saw snap.keyedLow as the lowest keyed row above where it walked
// from (0: none). Every id up to visible was taken before snap: with no
// keyed row above the floor, it rises there.
func (k *keyedFloor) advance(snap snapshot, visible int64) {
	// A transaction that ended before snap: the claim walked from where its
	// rows may start (keyedFrom in sql/claim.sql), and so did keyedLow.
	for _, from := range k.pending.ended(snap) {
		k.floor = min(k.floor, from)
	}
	to := visible
	if snap.keyedLow > 0 {
		to = snap.keyedLow - 1
	}
	if to > k.floor && k.pending.remember(snap, k.floor) {
		k.floor = to
	}
	k.owed = k.floor
	if snap.owedKeyedLow > 0 {
		k.owed = min(k.owed, snap.owedKeyedLow-1)
	}
}
