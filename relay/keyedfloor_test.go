package relay

import (
	"maps"
	"testing"
)

// The keyed floor rises to just below the lowest keyed row a claim saw, or,
// with none, to where every id was taken before its snapshot, remembering
// the transactions running at it; one seen ended sends the floor back to
// where its rows may start.
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
	}{
		{"to just below the lowest keyed row", 10, map[int64]int64{},
			snapshot{xmin: 5, xmax: 9, xip: []int64{5, 7}, keyedLow: 50}, 80, 49, map[int64]int64{5: 10, 7: 10}},
		{"no keyed row: to where every id was taken", 10, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9}, 80, 80, map[int64]int64{}},
		{"never down to a lower one", 60, map[int64]int64{},
			snapshot{xmin: 9, xmax: 9, keyedLow: 50}, 80, 60, map[int64]int64{}},
		{"a transaction already remembered keeps where its rows may start", 49, map[int64]int64{5: 10},
			snapshot{xmin: 5, xmax: 9, xip: []int64{5}, keyedLow: 70}, 80, 69, map[int64]int64{5: 10}},
		{"one ended: back to where its rows may start", 49, map[int64]int64{5: 10, 7: 30},
			snapshot{xmin: 7, xmax: 9, xip: []int64{7}, keyedLow: 70}, 80, 10, map[int64]int64{7: 30}},
	} {
		k := newKeyedFloor()
		k.floor, k.pending = tc.floor, tc.pending
		k.advance(tc.snap, tc.visible)
		if k.floor != tc.want || !maps.Equal(k.pending, tc.wantP) {
			t.Errorf("%s: floor %d, pending %v; want %d, %v", tc.name, k.floor, k.pending, tc.want, tc.wantP)
		}
	}
}
