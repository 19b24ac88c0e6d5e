package relay

// SetFinishing has fn run in each pass of the stranded-row cleanup, in its
// transaction and under the phase lock, before it finishes rows. Set it
// before Run.
func SetFinishing(r *Relay, fn func()) { hooksOf(r).finishing = fn }

// SetAfterPublish has fn run after each batch's publishes, before its
// record. Set it before Run.
func SetAfterPublish(r *Relay, fn func()) { hooksOf(r).afterPublish = fn }

func hooksOf(r *Relay) *testHooks {
	if r.hooks == nil {
		r.hooks = &testHooks{}
	}
	return r.hooks
}
