--[[
pswift_job_submit.lua: pswift's submit rules as a Lua module. slurmctld runs them for every
submission, under its locks, so they are fast, do no I/O, and their work is bounded whatever a
script holds. A site without a job_submit.lua of its own installs pswift's job_submit.lua, which
calls this module; a site with one calls it in three lines (docs/admin.md):

    package.path = "/etc/slurm/?.lua;" .. package.path      -- the folder of slurm.conf
    local pswift = require("pswift_job_submit")
    -- first in slurm_job_submit(job_desc, part_list, submit_uid):
    local rc = pswift.check(job_desc, part_list, submit_uid); if rc ~= slurm.SUCCESS then return rc end

A pswift job is a batch script pswift rendered: its second line (the first line ending within
MARK_BYTES) starts with pswift's marker, "# Rendered by pipeswift-slurm ". A script that merely
mentions pipeswift_launch, in a comment or a command, is not one. For pswift jobs:
  * adds --requeue when the request did not say (preemption in REQUEUE mode and the job's own
    `scontrol requeue` need it);
  * rejects contradictions, with a message the user sees at sbatch time:
      --no-requeue                    (a preempted pswift job must come back),
      --signal with SIGUSR1           (NCCL may catch it; pswift listens to USR2),
      --open-mode=truncate            (a requeued attempt would erase the earlier attempts' log);
  * rejects a script whose lines before its first command (sbatch's directive header) run past
    MAX_HEADER bytes: pswift renders a few KiB there, and nothing longer is read.
Slurm's Lua interface (22.05 and 25.11) cannot read open_mode, warn_signal or warn_time
("_set_job_field: unrecognized field"), so those two checks read the #SBATCH lines of the
script the way sbatch does: only the lines before the first command; arguments split and quoted
as sbatch's get_argument() splits them; options matched as getopt_long matches them (a unique
prefix of a long option is that option, "--opt=V" and "--opt V", an option that takes a value
consumes the next argument, short options and their clusters); values read as Slurm reads them
(--open-mode by its first letter, a signal number by strtol and cast to 16 bits, a name with or
without SIG in any case). The defaults for them come from the script pswift renders (it always
has --open-mode=append, and --signal=USR2@T whenever there is a time limit).
For every job, pswift's or not: a job name or work directory holding a control character (a
newline, a terminal escape: C0, DEL, or C1 as UTF-8) is refused. Slurm writes both unescaped
into jobcomp/filetxt, where a name holding a newline can forge another user's record, and into
every listing an admin reads on a terminal (pswift_slurm/slurm/filetxt.py says why text alone
cannot tell). Both are bounded by Slurm (1,024 bytes, PATH_MAX), and each is scanned once.
Other jobs pass otherwise untouched.
]]

local NO_VAL16 = 65534

-- Bounds, linear by construction: the marker is looked for in the script's first MARK_BYTES
-- only, and everything else reads a copy of its first MAX_HEADER bytes (never the whole
-- script, whatever its size). Inside that copy each line is found with a plain string.find,
-- blank lines and leading blanks with one anchored pattern each, and #SBATCH lines are split by
-- string.find between pieces: every step is linear in the header, so the work of any script is
-- bounded by 16 KiB of it. tests/test_job_submit_lua.py holds the time flat over a grammar of
-- script shapes up to 4 MiB; bench/job_submit.py measures it.
local MARK, MARK_BYTES = "# Rendered by pipeswift-slurm ", 1024
local MAX_HEADER = 16384

-- sbatch's long options (Slurm 25.11.7's `sbatch --autocomplete=--`; 22.05's are a subset).
-- Those that take a value read it from "--opt=V" or from the next argument.
local TAKES_VALUE = {
   "account", "acctg-freq", "array", "autocomplete", "batch", "bb", "bbf", "begin", "chdir",
   "cluster", "cluster-constraint", "clusters", "comment", "constraint", "container",
   "container-id", "context", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
   "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error", "exclude",
   "export", "export-file", "extra", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus",
   "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input",
   "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem",
   "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nodefile", "nodelist",
   "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
   "ntasks-per-socket", "ntasks-per-tres", "open-mode", "output", "partition", "prefer",
   "priority", "profile", "qos", "reservation", "resources", "segment", "signal",
   "sockets-per-node", "switches", "tasks-per-node", "thread-spec", "threads-per-core", "time",
   "time-min", "tmp", "tres-bind", "tres-per-task", "uid", "wait-all-nodes", "wckey", "wrap"
}
local FLAGS = {   -- no value, or one given only as "--opt=V"
   "consolidate-segments", "contiguous", "exclusive", "external", "get-user-env", "help",
   "hold", "ignore-pbs", "nice", "no-kill", "no-requeue", "oom-kill-step", "overcommit",
   "oversubscribe", "parsable", "propagate", "quiet", "reboot", "requeue", "resv-ports",
   "spread-job", "spread-segments", "stepmgr", "test-only", "usage", "use-min-nodes",
   "verbose", "version", "wait"
}
-- short options that take a value ("-oFILE" or "-o FILE"), with their long names where a check
-- reads them; the others (-h -H -O -Q -s -v -V -W, -k's value only attached) take none
local SHORT_VALUE = {A = "account", a = "array", b = "begin", D = "chdir", M = "clusters",
   C = "constraint", S = "core-spec", c = "cpus-per-task", d = "dependency", m = "distribution",
   e = "error", x = "exclude", B = "extra-node-info", G = "gpus", i = "input", J = "job-name",
   L = "licenses", F = "nodefile", w = "nodelist", N = "nodes", n = "ntasks", o = "output",
   p = "partition", q = "qos", t = "time"}

-- every prefix of every long option -> that option, or false when several share it (getopt_long:
-- an exact name wins, a unique prefix abbreviates, an ambiguous one is refused by sbatch)
local LONG, TAKES = {}, {}
local function index_options(names, takes)
   for _, name in ipairs(names) do
      TAKES[name] = takes
      for k = 1, #name do
         local prefix = string.sub(name, 1, k)
         if LONG[prefix] == nil then LONG[prefix] = name
         elseif LONG[prefix] ~= name then LONG[prefix] = false end
      end
   end
end
index_options(TAKES_VALUE, true)
index_options(FLAGS, false)
for _, name in ipairs(TAKES_VALUE) do LONG[name] = name end
for _, name in ipairs(FLAGS) do LONG[name] = name end

local function is_pswift(job_desc)
   local script = job_desc.script
   if type(script) ~= "string" then return false end
   local eol = string.find(string.sub(script, 1, MARK_BYTES), "\n", 1, true)   -- after the #! line
   return eol ~= nil and string.sub(script, eol + 1, eol + #MARK) == MARK
end

-- A line where only spaces separate arguments (no quote, backslash, #, tab...): split with
-- plain string.find, which is memchr-fast (a character class costs ~10-40 ns a character in Lua).
local function is_simple(line)
   return string.find(line, "[\\'\"#\t\r\v\f]") == nil
end

local function add_simple_arguments(line, args)
   local pos, n, k = 1, #line, #args
   while pos <= n do
      local _, spaces = string.find(line, "^ *", pos)   -- a run of spaces in one anchored step
      pos = spaces + 1
      if pos > n then return end
      local stop = string.find(line, " ", pos, true) or (n + 1)
      k = k + 1
      args[k] = string.sub(line, pos, stop - 1)
      pos = stop + 1
   end
end

-- Any other line, as sbatch's get_argument() splits it: whitespace separates; ' or " group; a
-- backslash makes the next character literal (inside quotes too); an unquoted # ends the line;
-- an empty argument ("") ends the line too, as in sbatch. Each piece is one string.sub between
-- string.find hits, so the work is linear in the line.
local function add_quoted_arguments(line, args)
   local pos, n = 1, #line
   while true do
      pos = string.find(line, "%S", pos)
      if pos == nil then return end
      local buf, quote = {}, nil
      while pos <= n do
         local hit = string.find(line, quote == '"' and '[\\"]' or quote == "'" and "[\\']"
                                 or "[%s\\'\"#]", pos)
         if hit == nil then
            if quote then return end   -- unmatched quote: sbatch refuses the script
            buf[#buf + 1] = string.sub(line, pos)
            pos = n + 1
            break
         end
         if hit > pos then buf[#buf + 1] = string.sub(line, pos, hit - 1) end
         local c = string.sub(line, hit, hit)
         if c == "\\" then
            buf[#buf + 1] = string.sub(line, hit + 1, hit + 1)
            pos = hit + 2
         elseif quote then
            quote, pos = nil, hit + 1   -- the closing quote
         elseif c == "'" or c == '"' then
            quote, pos = c, hit + 1
         elseif c == "#" then
            if #buf > 0 then args[#args + 1] = table.concat(buf) end
            return
         else
            pos = hit   -- whitespace ends this argument
            break
         end
      end
      if #buf == 0 then return end
      args[#args + 1] = table.concat(buf)
   end
end

-- The arguments sbatch reads from `header` (the script's first MAX_HEADER bytes): those of the
-- #SBATCH lines up to the first line that is neither blank nor a comment (sbatch: a line whose
-- first character that is not a space is not "#"). Blank lines and leading blanks go in one
-- anchored step each; every other line is found with a plain string.find. Returns nil when no
-- command starts inside the header and the script goes on past it.
local function script_arguments(header, whole)
   local args, pos, n = {}, 1, #header
   while pos <= n do
      local _, blanks = string.find(header, "^[ \t\r\v\f\n]*", pos)
      pos = blanks + 1
      if pos > n then break end
      local stop = string.find(header, "\n", pos, true)
      local cut = stop == nil and whole > n   -- this line goes on past the header
      stop = stop or n + 1
      local at_line_start = pos == 1 or string.byte(header, pos - 1) == 10
      if at_line_start and string.sub(header, pos, pos + 6) == "#SBATCH" then
         if cut then return nil end
         local line = string.sub(header, pos + 7, stop - 1)
         if is_simple(line) then
            add_simple_arguments(line, args)
         else
            add_quoted_arguments(line, args)
         end
      elseif string.byte(header, pos) ~= 35 then
         return args   -- the first command
      elseif cut then
         return nil    -- a comment that goes on past the header
      end
      pos = stop + 1
   end
   if whole > n then return nil end   -- blank or comment lines up to the header's end, and more
   return args
end

-- {option = {values...}} for the long options in `wanted`, as getopt_long reads `args`.
local function option_values(args, wanted)
   local out, k, n = {}, 1, #args
   for name in pairs(wanted) do out[name] = {} end
   local function found(name, value)
      if out[name] and value ~= nil then table.insert(out[name], value) end
   end
   while k <= n do
      local a = args[k]
      if a == "--" then break end
      if string.sub(a, 1, 2) == "--" then
         local eq = string.find(a, "=", 3, true)
         local name = LONG[string.sub(a, 3, (eq or 0) - 1)]
         if name and eq then
            found(name, string.sub(a, eq + 1))
         elseif name and TAKES[name] then
            found(name, args[k + 1])
            k = k + 1
         end
      elseif string.sub(a, 1, 1) == "-" and #a > 1 then
         local j = 2   -- a cluster of short options: flags, then at most one taking a value
         while j <= #a do
            local long = SHORT_VALUE[string.sub(a, j, j)]
            if long then
               if j < #a then found(long, string.sub(a, j + 1)) else found(long, args[k + 1]); k = k + 1 end
               break
            end
            j = j + 1
         end
      end
      k = k + 1
   end
   return out
end

-- Slurm's get_signal_opts(): [R][B][R][:]<sig>[@time], R and B in any case
local function signal_part(spec)
   local pos = 1
   for _, flag in ipairs({"r", "b", "r"}) do
      if string.lower(string.sub(spec, pos, pos)) == flag then pos = pos + 1 end
   end
   if string.sub(spec, pos, pos) == ":" then pos = pos + 1 end
   local at = string.find(spec, "@", pos, true)
   return string.sub(spec, pos, at and at - 1 or #spec)
end

local SPACE = "^[ \t\n\v\f\r]*$"

-- Slurm's sig_name2num() then the (uint16_t) cast: a number as strtol reads it (leading blanks, a
-- sign, digits saturating at the long's range, then only blanks), or a name with an optional
-- SIG in any case; 0 for anything else. Plain Lua 5.1 arithmetic (Debian's slurmctld embeds 5.1,
-- a source build 5.3): the low 16 bits are kept digit by digit, saturation decided on the digits.
local LONG_MAX_DIGITS = "9223372036854775807"
local function signal_number(sig)
   local _, e, sign, digits = string.find(sig, "^[ \t\n\v\f\r]*([+-]?)(%d+)")
   if digits then
      if not string.find(sig, SPACE, e + 1) then return 0 end
      digits = string.gsub(digits, "^0+", "")
      local saturated = #digits > #LONG_MAX_DIGITS or (#digits == #LONG_MAX_DIGITS and digits > LONG_MAX_DIGITS)
      if saturated then return sign == "-" and 0 or 65535 end   -- LONG_MIN, LONG_MAX: their low 16 bits
      local low = 0
      for i = 1, #digits do
         low = (low * 10 + string.byte(digits, i) - 48) % 65536
      end
      if sign == "-" then low = (65536 - low) % 65536 end
      return low
   end
   local name = string.upper((string.gsub(sig, "^[ \t\n\v\f\r]*", "")))
   if string.sub(name, 1, 3) == "SIG" then name = string.sub(name, 4) end
   if string.sub(name, 1, 4) == "USR1" and string.find(name, SPACE, 5) then return 10 end
   return -1   -- another name, or none: not SIGUSR1 (sbatch refuses what it cannot read)
end

local function is_usr1(spec)
   return signal_number(signal_part(spec)) == 10   -- SIGUSR1 on Linux
end

-- Slurm's arg_set_open_mode(): the first letter decides (a/A append, t/T truncate)
local function is_truncate(mode)
   local c = string.sub(mode, 1, 1)
   return c == "t" or c == "T"
end

-- a C0 control character or DEL (%c in the C locale Slurm runs Lua in), or a C1 control
-- character as UTF-8 encodes it (0xC2 0x80-0x9F)
local CONTROL, C1 = "[%c\127]", "\194[\128-\159]"
local function control_in(text)
   return type(text) == "string" and (string.find(text, CONTROL) ~= nil or string.find(text, C1) ~= nil)
end

local M = {}

-- slurm.SUCCESS, or slurm.ERROR with a message the user sees (the job is not queued)
function M.check(job_desc, part_list, submit_uid)
   if control_in(job_desc.name) then
      slurm.log_user("pswift: this job's name holds a newline or another control character, which Slurm writes unescaped into its job records and listings; choose a name without them (-J/--job-name)")
      return slurm.ERROR
   end
   if control_in(job_desc.work_dir) then
      slurm.log_user("pswift: this job's work directory holds a newline or another control character, which Slurm writes unescaped into its job records and listings; submit from (or --chdir to) a directory without them")
      return slurm.ERROR
   end
   if not is_pswift(job_desc) then
      return slurm.SUCCESS
   end
   if job_desc.requeue == 0 then
      slurm.log_user("pswift: this pipeswift job asks --no-requeue, but a preempted or timed-out pswift job must be requeued to resume from its checkpoint; drop --no-requeue")
      return slurm.ERROR
   end
   local script = job_desc.script
   local args = script_arguments(string.sub(script, 1, MAX_HEADER), #script)
   if args == nil then
      slurm.log_user("pswift: this pipeswift job's lines before its first command (its #SBATCH header) run past %d bytes; pswift renders a few KiB there: render the script again with `pswift sbatch`, and put long text after the first command", MAX_HEADER)
      return slurm.ERROR
   end
   local given = option_values(args, {["signal"] = true, ["open-mode"] = true})
   for _, spec in ipairs(given["signal"]) do
      if is_usr1(spec) then
         slurm.log_user("pswift: --signal with SIGUSR1 conflicts with NCCL; pswift checkpoints on USR2 (use --signal=USR2@SECONDS)")
         return slurm.ERROR
      end
   end
   for _, mode in ipairs(given["open-mode"]) do
      if is_truncate(mode) then
         slurm.log_user("pswift: --open-mode=truncate would erase the log of earlier attempts when the job is requeued; use --open-mode=append")
         return slurm.ERROR
      end
   end
   if job_desc.requeue == nil or job_desc.requeue == NO_VAL16 then
      job_desc.requeue = 1
      slurm.log_info("pswift job_submit: added --requeue to pswift job %s", tostring(job_desc.name))
   end
   return slurm.SUCCESS
end

return M
