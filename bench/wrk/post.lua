-- wrk script of the bench (bench/loadgen.py runs it; not a test). One request, repeated:
--   WRK_METHOD        the method (default POST)
--   WRK_BODY_FILE     a file holding the body, sent as is
--   WRK_HEADERS_FILE  a file of "Name: value" lines
-- Both files are written by the bench at run time into its state directory (tokens included):
-- nothing they hold is committed. At the end one line is printed to stdout:
--   WRK_JSON {"requests": ..., "non2xx": ..., "p50_us": ..., "p99_us": ..., ...}
-- Answers that are not 2xx are counted in every thread (response() below) and summed in done();
-- the first one's status and the start of its body are kept, so a failed run says why.

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end

wrk.method = os.getenv("WRK_METHOD") or "POST"
local body_file = os.getenv("WRK_BODY_FILE")
if body_file and body_file ~= "" then
  wrk.body = slurp(body_file)
end
local headers_file = os.getenv("WRK_HEADERS_FILE")
if headers_file and headers_file ~= "" then
  for line in io.lines(headers_file) do
    local name, value = line:match("^([^:]+):%s*(.-)%s*$")
    if name then
      wrk.headers[name] = value
    end
  end
end

-- per thread (each thread has its own Lua state): read back by done() through thread:get
non2xx = 0
first_bad = ""

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function response(status, headers, body)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    if first_bad == "" then
      first_bad = tostring(status) .. " " .. string.sub(body or "", 1, 300)
    end
  end
end

local function json_string(s)
  -- every control character, quote and backslash as \u00XX: valid JSON whatever the body held
  return '"' .. s:gsub('[%c"\\]', function(c)
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

function done(summary, latency, requests)
  local bad, sample = 0, ""
  for _, thread in ipairs(threads) do
    bad = bad + (thread:get("non2xx") or 0)
    local s = thread:get("first_bad") or ""
    if sample == "" and s ~= "" then
      sample = s
    end
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"non2xx":%d,'
      .. '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeouts":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f,"first_bad":%s}\n',
    summary.requests, summary.duration, summary.bytes, bad,
    e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    json_string(sample)
  ))
end
