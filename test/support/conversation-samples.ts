// Small files in the published LoCoMo and LongMemEval formats, for the import tests and the
// retrieval bench's test. Contents are made up; the shapes follow the datasets.

export function locomoSample(): unknown[] {
  return [
    {
      sample_id: "conv-26",
      conversation: {
        speaker_a: "Caroline",
        speaker_b: "Melanie",
        session_1_date_time: "1:56 pm on 8 May, 2023",
        session_1: [
          { speaker: "Caroline", dia_id: "D1:1", text: "Hey Mel! I went to an LGBTQ support group yesterday and it was so powerful." },
          { speaker: "Melanie", dia_id: "D1:2", text: "That's great, Caroline! I've been painting a lot lately, mostly sunsets by the lake." },
          { speaker: "Caroline", dia_id: "D1:3", text: "I'm thinking about studying counseling so I can help people like me." },
          { speaker: "Melanie", dia_id: "D1:4", text: "Look at this one I painted last week.", img_url: ["https://example.invalid/p.jpg"], blip_caption: "a photo of a painting of a sunset over a lake" },
        ],
        session_2_date_time: "1:14 pm on 25 May, 2023",
        session_2: [
          { speaker: "Melanie", dia_id: "D2:1", text: "I ran a charity race for mental health last Saturday!" },
          { speaker: "Caroline", dia_id: "D2:2", text: "Amazing. I'm planning to adopt a child on my own someday." },
          { speaker: "Melanie", dia_id: "D2:3", text: "My kids loved the camping trip to the mountains last month." },
        ],
      },
      qa: [
        { question: "When did Caroline go to the LGBTQ support group?", answer: "7 May 2023", evidence: ["D1:1"], category: 2 },
        { question: "What does Melanie like to paint?", answer: "Sunsets", evidence: ["D1:2", "D1:4"], category: 1 },
        { question: "What career is Caroline considering?", answer: "Counseling", evidence: ["D1:3"], category: 1 },
        { question: "What race did Melanie run?", answer: "A charity race for mental health", evidence: ["D2:1"], category: 4 },
        { question: "Where did Melanie's kids go camping?", answer: "The mountains", evidence: ["D2:3"], category: 4 },
      ],
    },
    {
      // Some copies put the sessions and qa at the sample's top level; no sample_id here.
      speaker_a: "Jon",
      speaker_b: "Gina",
      session_1_date_time: "4:04 pm on 20 January, 2023",
      session_1: [
        { speaker: "Jon", dia_id: "D1:1", text: "I lost my job as a banker, so I'm opening a dance studio." },
        { speaker: "Gina", dia_id: "D1:2", text: "I lost my job too. I want to start an online clothing store." },
      ],
      session_10_date_time: "2:00 pm on 3 March, 2023",
      session_10: [{ speaker: "Jon", dia_id: "D10:1", text: "The dance studio finally opened downtown this week!" }],
      qa: [
        { question: "What business is Jon starting?", answer: "A dance studio", evidence: ["D1:1", "D10:1"], category: 1 },
        { question: "What did Gina want to sell online?", answer: "Clothing", evidence: ["D1:2"], category: 1 },
        { question: "Is there an answer to this adversarial question?", answer: "No", evidence: [], category: 5 },
      ],
    },
  ];
}

export function longMemEvalSample(): unknown[] {
  return [
    {
      question_id: "e47becba",
      question_type: "single-session-user",
      question: "What degree did I graduate with?",
      answer: "Business Administration",
      question_date: "2023/05/30 (Tue) 23:40",
      haystack_session_ids: ["sharegpt_yywfQ9J_0", "answer_280352e9"],
      haystack_dates: ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 10:00"],
      haystack_sessions: [
        [
          { role: "user", content: "Can you suggest a recipe for banana bread?" },
          { role: "assistant", content: "Sure! Mash three ripe bananas..." },
        ],
        [
          { role: "user", content: "I graduated with a degree in Business Administration, what jobs fit?", has_answer: true },
          { role: "assistant", content: "Marketing, operations and consulting are common paths." },
        ],
      ],
      answer_session_ids: ["answer_280352e9"],
    },
  ];
}
