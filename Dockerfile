# syntax=docker/dockerfile:1
# relayd's image: configured by RELAY_* environment variables alone, e.g.
#   docker run -e RELAY_DATABASE_URL=postgres://... -e RELAY_AMQP_URL=amqp://... \
#     -e RELAY_NATS_URL=nats://... -p 9090:9090 relayd
# runs `relayd run`; any other command goes after the image name.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# VERSION is what `relayd version` and /version report: compose passes it
# (`make up`: git describe); a bare `docker build` says "dev".
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /relayd ./cmd/relayd

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="relayd" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /relayd /relayd
USER nonroot
# /metrics, /healthz, /readyz and /version, on every interface: relayd's
# default, 127.0.0.1:9090, cannot be reached from outside the container.
ENV RELAY_METRICS_ADDR=:9090
EXPOSE 9090
ENTRYPOINT ["/relayd"]
CMD ["run"]
