package amqpsink

import "time"

// lateTTL bounds how long a late confirm is remembered: far longer than the
// relay's retry backoff reaches before the row is retried.
const lateTTL = 15 * time.Minute

// OnLateConfirm implements relay.LateConfirmer.
func (s *Sink) OnLateConfirm(f func(msgID string)) {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	s.onLate = f
}

// confirmedLate notes a confirm that came after its publish gave up waiting,
// so that a retry of the row is answered without queueing a second copy.
func (s *Sink) confirmedLate(msgID string) {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	if s.onLate != nil {
		s.onLate(msgID)
	}
	now := time.Now()
	if len(s.late)%1024 == 1023 {
		for id, at := range s.late {
			if now.Sub(at) > lateTTL {
				delete(s.late, id)
			}
		}
	}
	s.late[msgID] = now
}

// takeLate reports, once, whether msgID was confirmed late.
func (s *Sink) takeLate(msgID string) bool {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	at, ok := s.late[msgID]
	delete(s.late, msgID)
	return ok && time.Since(at) <= lateTTL
}
