package relay

import (
	"maps"
	"testing"
)

// The keyed floor rises to just below the lowest keyed row a claim saw, or,
// with none, to where every id was taken before its snapshot, remembering
// the transactions running at it; one seen ended: from where its rows may
// start, which the claim walked from. The owed table's keyed floor is the same, or
// just below the lowest keyed row owed there, whichever is lower.
func TestKeyedFloorAdvance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		floor   int64
		pending map[int64]int64
		snap    snapshot
		visible int64
		want    int64
		wantP   map[int64]int64
		owed    int64
	}{
		{"to just below the lowest keyed row", 10, map[int64]int64{},
			snapshot{xmin: 5, xmax: 9, xid: 9, xip: []int64{5, 7}, keyedLow: 50}, 80, 49, map[int64]int64{5: 10, 7: 10}, 49},
		{"no keyed row: to where every id was taken", 10, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9, xid: 9}, 80, 80, map[int64]int64{}, 80},
		{"a keyed row owed in the owed table: the owed floor below it", 10, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9, xid: 9, owedKeyedLow: 30}, 80, 80, map[int64]int64{}, 29},
		{"one owed above the floor: the owed floor is the floor", 10, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9, xid: 9, keyedLow: 50, owedKeyedLow: 70}, 80, 49, map[int64]int64{}, 49},
		{"never down to a lower one", 60, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9, xid: 9, keyedLow: 50}, 80, 60, map[int64]int64{}, 60},
		{"a transaction already remembered keeps where its rows may start", 49, map[int64]int64{5: 10},
			snapshot{xmin: 5, xmax: 9, xid: 9, xip: []int64{5}, keyedLow: 70}, 80, 69, map[int64]int64{5: 10}, 69},
		// The claim walked from where an ended one's rows may start, and saw
		// the lowest keyed row from there.
		{"one ended: up from where its rows may start", 49, map[int64]int64{5: 10, 7: 30},
			snapshot{xmin: 7, xmax: 9, xid: 9, xip: []int64{7}, keyedLow: 70, owedKeyedLow: 60}, 80, 69, map[int64]int64{7: 30}, 59},
		{"one ended, its row the lowest: just below it", 49, map[int64]int64{5: 10},
			snapshot{xmin: 9, xmax: 9, xid: 9, keyedLow: 20}, 80, 19, map[int64]int64{}, 19},
		// Postgres lists only the running ids below xmax, one past the newest
		// ended: those from xmax up to the claim's own id may hold rows too.
		{"ids from xmax up to the claim's own: remembered", 10, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9, xid: 11, keyedLow: 50}, 80, 49, map[int64]int64{9: 10, 10: 10}, 49},
		{"one remembered from xmax up, still not below xmax: not ended", 49, map[int64]int64{9: 10},
			snapshot{xmin: 9, xmax: 9, xid: 12, keyedLow: 70}, 80, 69, map[int64]int64{9: 10, 10: 49, 11: 49}, 69},
		{"a claim with no id of its own: the floor stays", 10, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9, keyedLow: 50}, 80, 10, map[int64]int64{}, 10},
	} {
		k := newKeyedFloor()
		k.floor, k.pending = tc.floor, tc.pending
		k.advance(tc.snap, tc.visible)
		if k.floor != tc.want || !maps.Equal(k.pending, tc.wantP) || k.owed != tc.owed {
			t.Errorf("%s: floor %d, pending %v, owed %d; want %d, %v, %d", tc.name, k.floor, k.pending, k.owed, tc.want, tc.wantP, tc.owed)
		}
	}
}
