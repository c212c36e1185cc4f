# Sourced by the GPU-machine scripts: health_ok PORT succeeds when m3serve on 127.0.0.1:PORT
# answers GET /health with 200. Through bash's /dev/tcp, because the GPU machine may have no curl.
health_ok() {
  local line
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
  IFS= read -r -t 5 line <&3
  exec 3<&- 3>&-
  [[ $line == "HTTP/1."?" 200"* ]]
}
