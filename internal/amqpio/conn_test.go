package amqpio

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// counting counts the reads and writes that reach a connection.
type counting struct {
	net.Conn
	reads, writes *atomic.Int64
}

func (c counting) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

func (c counting) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// pair returns a loopback TCP connection, the client side as a *Conn over
// a counting wrapper, and the server side.
func pair(t *testing.T) (*Conn, net.Conn, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	var reads, writes atomic.Int64
	var made *Conn
	c, err := Dial(5*time.Second, func(c net.Conn) net.Conn { return counting{Conn: c, reads: &reads, writes: &writes} },
		func(c *Conn) { made = c })("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Time{}) // DefaultDial's handshake deadline
	srv := <-accepted
	if srv == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	if c != net.Conn(made) {
		t.Fatal("made was not told the connection Dial returned")
	}
	return made, srv, &reads, &writes
}

// Through amqp091-go's 4 KiB reader, 100 KiB that wait in the socket take
// two reads of it (and one for the end), not one per 4 KiB; every byte
// arrives, in order.
func TestReadsInLargeChunks(t *testing.T) {
	c, srv, reads, _ := pair(t)
	want := make([]byte, 100<<10)
	rand.Read(want)
	if _, err := srv.Write(want); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	time.Sleep(100 * time.Millisecond) // all of it in the socket
	got, err := io.ReadAll(bufio.NewReaderSize(c, 4096))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(want))
	}
	if n := reads.Load(); n > 4 {
		t.Errorf("%d reads of the socket for 100 KiB, want at most 4", n)
	}
}

// Writes between Cork and Uncork reach the socket at Uncork, in one write,
// in the order they were made, from several goroutines; without a cork,
// each write goes at once.
func TestCorkedWritesLeaveTogether(t *testing.T) {
	c, srv, _, writes := pair(t)
	var got bytes.Buffer
	var mu sync.Mutex
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 1<<16)
		for {
			n, err := srv.Read(buf)
			mu.Lock()
			got.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return got.Len()
	}

	c.Cork()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				c.Write([]byte{byte(g), byte(i)})
			}
		}()
	}
	wg.Wait()
	time.Sleep(50 * time.Millisecond)
	if n := received(); n != 0 || writes.Load() != 0 {
		t.Fatalf("corked: %d bytes arrived in %d writes, want none yet", n, writes.Load())
	}
	if err := c.Uncork(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 1 {
		t.Fatalf("Uncork took %d writes, want 1", n)
	}
	c.Write([]byte{9, 9})
	if n := writes.Load(); n != 2 {
		t.Fatalf("an uncorked write took %d writes in all, want 2", n)
	}
	c.Close()
	<-readDone
	b := got.Bytes()
	if len(b) != 4*50*2+2 {
		t.Fatalf("%d bytes arrived, want %d", len(b), 4*50*2+2)
	}
	next := map[byte]byte{}
	for i := 0; i+1 < len(b)-2; i += 2 {
		g, n := b[i], b[i+1]
		if n != next[g] {
			t.Fatalf("goroutine %d: write %d arrived after write %d", g, n, next[g]-1)
		}
		next[g]++
	}
}

// A cork holds at most 128 KiB: past that the writes go out.
func TestCorkIsBounded(t *testing.T) {
	c, srv, _, writes := pair(t)
	go io.Copy(io.Discard, srv)
	c.Cork()
	chunk := make([]byte, 4096)
	for range 40 { // 160 KiB
		if _, err := c.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if n := writes.Load(); n != 1 {
		t.Fatalf("160 KiB under a cork took %d writes, want 1 (at 128 KiB)", n)
	}
	c.Uncork(time.Time{})
	if n := writes.Load(); n != 2 {
		t.Fatalf("after Uncork, %d writes in all, want 2", n)
	}
}

// A peer that stops reading (as RabbitMQ does with a connection it blocks)
// holds no write for good: a write outside a cork and a cork's flush at its
// limit give up after WriteWait, close the connection, and every later
// write fails at once — they used to wait in the kernel for as long as the
// peer did not read, holding the connection's mutex.
func TestWritesToAPeerThatDoesNotReadAreBounded(t *testing.T) {
	defer func(w time.Duration) { WriteWait = w }(WriteWait)
	WriteWait = 300 * time.Millisecond
	for _, corked := range []bool{false, true} {
		c, _, _, _ := pair(t) // the server side never reads
		if corked {
			c.Cork()
		}
		chunk := make([]byte, 64<<10)
		start := time.Now()
		var err error
		for i := 0; i < 1000 && err == nil; i++ { // far more than the socket buffers hold
			_, err = c.Write(chunk)
		}
		took := time.Since(start)
		if err == nil {
			t.Fatalf("corked %v: 64 MiB written to a peer that reads nothing", corked)
		}
		if took > 5*time.Second {
			t.Fatalf("corked %v: the write failed after %v, want about WriteWait (%v)", corked, took, WriteWait)
		}
		if _, err := c.Write([]byte("x")); err == nil {
			t.Fatalf("corked %v: a write after the timed-out one succeeded, want the connection closed", corked)
		}
	}
}
